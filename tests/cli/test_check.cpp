#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <vector>

#include "cli/check.h"
#include "cli/check_network.h"
#include "data/shard.h"
#include "kernels/backend.h"
#include "model/manifest.h"
#include "peer/local_cluster.h"
#include "peer/peer_node.h"
#include "tests/support/files.h"

using namespace starling;
using namespace starling::cli;

namespace {

// A socket listening on 127.0.0.1 at a port the kernel chose, closed with the object.
class Listening {
public:
    Listening() {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        REQUIRE(fd_ >= 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
        REQUIRE(::listen(fd_, 4) == 0);
        socklen_t size = sizeof(address);
        REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size) == 0);
        port_ = ntohs(address.sin_port);
    }
    ~Listening() { ::close(fd_); }
    Listening(const Listening&) = delete;
    Listening& operator=(const Listening&) = delete;

    uint16_t port() const { return port_; }
    std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

private:
    int fd_ = -1;
    uint16_t port_ = 0;
};

// A node config whose addresses are all free: the checks under test change one thing at a time.
NodeConfig local_config() {
    NodeConfig config;
    config.swarm.peer.listen = "127.0.0.1:0";
    config.control_listen = "127.0.0.1:0";
    config.metrics_listen = "";
    return config;
}

bool has_level(const std::vector<CheckResult>& results, CheckLevel level) {
    for (const CheckResult& r : results)
        if (r.level == level) return true;
    return false;
}

}  // namespace

TEST_CASE("a check prints as one line, with the fix on a second for warn and FAIL") {
    CHECK(format_check({CheckLevel::Ok, "seeds", "none: the node starts a new swarm", ""}) ==
          "ok    seeds: none: the node starts a new swarm\n");
    CHECK(format_check({CheckLevel::Warn, "seeds", "1 of 1 unreachable", "check the firewall"}) ==
          "warn  seeds: 1 of 1 unreachable\n      fix: check the firewall\n");
    CHECK(format_check({CheckLevel::Fail, "data", "no shards", "starling data prepare --out d"}) ==
          "FAIL  data: no shards\n      fix: starling data prepare --out d\n");
}

TEST_CASE("the data check needs train and val shards and says how to make them") {
    test::TempDir dir;
    NodeConfig config = local_config();
    config.swarm.train.data.dir = dir.path().string();
    CheckResult result = check_data(config);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.fix.find("starling data prepare --out " + dir.path().string()) !=
          std::string::npos);

    const std::vector<uint16_t> tokens(100, 7);
    write_shard(dir.file("train_000000.bin").string(), tokens);
    result = check_data(config);
    CHECK(result.level == CheckLevel::Fail);  // no val shard yet
    CHECK(result.detail.find("val") != std::string::npos);

    write_shard(dir.file("val_000000.bin").string(), std::vector<uint16_t>(10, 3));
    result = check_data(config);
    CHECK(result.level == CheckLevel::Ok);
    CHECK(result.detail.find("1 train shard(s) of 100 tokens, 1 val shard(s) of 10 tokens") !=
          std::string::npos);

    test::put(dir.file("val_000000.bin"), "not a shard");
    result = check_data(config);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.detail.find("val_000000.bin") != std::string::npos);
}

TEST_CASE("the data_dir check finds where the directory would be created and its space") {
    test::TempDir dir;
    NodeConfig config = local_config();
    config.data_dir = dir.path() / "node" / "deeper";
    CheckResult result = check_data_dir(config);
    CHECK(result.level == CheckLevel::Ok);
    CHECK(result.detail.find("created under " + dir.path().string()) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(config.data_dir));  // a preflight leaves no trace
    CHECK(test::dir_names(dir.path()).empty());

    test::put(dir.file("node"), "a file where the directory should be");
    result = check_data_dir(config);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.detail.find("is not a directory") != std::string::npos);
}

TEST_CASE("the device check names the CPU's cores and never fails for want of a GPU") {
    NodeConfig config = local_config();
    for (const char* device : {"auto", "cpu"}) {
        config.swarm.train.device = device;
        const CheckResult result = check_device(config);
        CHECK(result.level == CheckLevel::Ok);
        CHECK(result.detail.find("core(s)") != std::string::npos);
    }
}

TEST_CASE("a port in use, or taken twice, fails naming the address") {
    const Listening taken;
    NodeConfig config = local_config();
    config.swarm.peer.listen = taken.address();
    std::vector<CheckResult> results = check_ports(config);
    REQUIRE(results.size() == 2);  // peer and control; metrics is off
    CHECK(results[0].level == CheckLevel::Fail);
    CHECK(results[0].detail == "peer " + taken.address() + " is in use");
    CHECK(results[0].fix.find("[peer].listen") != std::string::npos);
    CHECK(results[1].level == CheckLevel::Ok);

    config = local_config();
    config.swarm.peer.listen = "0.0.0.0:47000";
    config.metrics_listen = "127.0.0.1:47000";
    results = check_ports(config);
    REQUIRE(results.size() == 3);
    CHECK(results[2].level == CheckLevel::Fail);
    CHECK(results[2].detail.find("metrics 127.0.0.1:47000 takes the port of peer 0.0.0.0:47000") !=
          std::string::npos);

    config = local_config();
    config.control_listen = "unix:/run/starling/control.sock";  // no port to bind
    config.metrics_listen = "nonsense";
    results = check_ports(config);
    REQUIRE(results.size() == 2);
    CHECK(results[1].level == CheckLevel::Fail);
    CHECK(results[1].detail == "metrics address 'nonsense' is not host:port");

    CHECK_FALSE(has_level(check_ports(local_config()), CheckLevel::Fail));
}

TEST_CASE("the announce check applies the peer layer's rule") {
    NodeConfig config = local_config();
    CHECK(check_announce(config).level == CheckLevel::Ok);

    config.swarm.peer.listen = "0.0.0.0:7700";
    config.swarm.peer.seeds = {"10.0.0.2:7700"};
    CheckResult result = check_announce(config);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.fix.find("[peer].announce") != std::string::npos);

    config.swarm.peer.announce = "10.0.0.5:7700";
    result = check_announce(config);
    CHECK(result.level == CheckLevel::Ok);
    CHECK(result.detail == "peers will dial 10.0.0.5:7700");
}

TEST_CASE(
    "seeds: none starts a swarm, an unreachable one warns, a malformed one or a wrong secret fails") {
    NodeConfig config = local_config();
    CheckResult result = check_seeds(config);
    CHECK(result.level == CheckLevel::Ok);
    CHECK(result.detail.find("new swarm") != std::string::npos);

    // A real member: the check makes an authenticated call to it.
    PeerConfig member_config = local_cluster_config();
    member_config.fingerprint = ParameterManifest(config.swarm.train.model).fingerprint();
    member_config.model = model_signature(config.swarm.train.model);
    PeerNode member(member_config);
    member.start();
    config.swarm.peer.swarm_secret = local_cluster_config().swarm_secret;
    config.swarm.peer.swarm_id = local_cluster_config().swarm_id;
    config.swarm.peer.seeds = {member.address()};
    result = check_seeds(config);
    INFO(result.detail);
    CHECK(result.level == CheckLevel::Ok);

    NodeConfig stranger = config;
    stranger.swarm.peer.swarm_secret = "another swarm's secret entirely";
    result = check_seeds(stranger);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.detail.find("1 of 1 refused this node's credentials: " + member.address()) !=
          std::string::npos);
    CHECK(result.detail.find("wrong swarm secret") != std::string::npos);

    // Something listens, but no Starling node: it cannot vouch for the secret.
    const Listening not_a_node;
    config.swarm.peer.seeds = {member.address(), not_a_node.address()};
    result = check_seeds(config);
    CHECK(result.level == CheckLevel::Warn);
    CHECK(result.detail.find("1 of 2 unreachable: " + not_a_node.address()) != std::string::npos);

    std::string closed;
    {
        const Listening gone;
        closed = gone.address();
    }
    config.swarm.peer.seeds = {member.address(), closed};
    result = check_seeds(config);
    CHECK(result.level == CheckLevel::Warn);
    CHECK(result.detail.find("1 of 2 unreachable: " + closed) != std::string::npos);

    config.swarm.peer.seeds = {"notaport"};
    result = check_seeds(config);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.detail.find("'notaport'") != std::string::npos);
}

TEST_CASE("connect and bind problems are named") {
    const Listening open;
    CHECK(connect_problem("127.0.0.1", open.port(), kSeedConnectTimeout).empty());
    CHECK(bind_problem("127.0.0.1", open.port()) == "in use");
    CHECK(bind_problem("127.0.0.1", 0).empty());
    CHECK(
        connect_problem("no-such-host.invalid", 7700, kSeedConnectTimeout).find("cannot resolve") ==
        0);
}

TEST_CASE("the credentials check never prints the secret") {
    NodeConfig config = local_config();
    config.swarm.peer.swarm_secret = "correct horse battery staple, long enough";
    CheckResult result = check_credentials(config);
    CHECK(result.level == CheckLevel::Ok);
    CHECK(result.detail.find("horse") == std::string::npos);

    config.swarm.peer.swarm_secret = "x";
    result = check_credentials(config);
    CHECK(result.level == CheckLevel::Warn);
    CHECK(result.fix.find("openssl rand") != std::string::npos);

    config.swarm.peer.tls = {"/nonexistent/ca.pem", "/nonexistent/node.pem",
                             "/nonexistent/node.key"};
    result = check_credentials(config);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.detail.find("/nonexistent/") != std::string::npos);
}

TEST_CASE("the device check fails for a GPU the machine does not have, and says what to set") {
    NodeConfig config = local_config();
    std::string reason;
    const int devices = usable_cuda_devices(&reason);
    config.swarm.train.device = "cuda:" + std::to_string(devices);  // one past the last
    const CheckResult result = check_device(config);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.detail.find(config.swarm.train.device + ": not available") != std::string::npos);
    CHECK(result.fix.find("[train].device") != std::string::npos);
}

TEST_CASE(
    "the device check names the missing GPU of a list, and a batch that does not split over the GPUs") {
    NodeConfig config = local_config();
    const int devices = usable_cuda_devices();
    const std::string missing = "cuda:" + std::to_string(devices);
    config.swarm.train.device = missing + "," + std::to_string(devices + 1);
    CheckResult result = check_device(config);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.detail.find(missing + ": not available") != std::string::npos);

    config.swarm.train.device = "cuda:all";
    if (devices == 0) {
        result = check_device(config);
        CHECK(result.level == CheckLevel::Fail);
        CHECK(result.detail.find("cuda:all: not available") != std::string::npos);
    } else if (devices > 1) {
        config.swarm.train.batch_size = 2 * devices + 1;
        result = check_device(config);
        CHECK(result.level == CheckLevel::Fail);
        CHECK(result.detail.find("does not split evenly over " + std::to_string(devices) +
                                 " GPUs") != std::string::npos);
        config.swarm.train.batch_size = 2 * devices;
        result = check_device(config);
        CHECK(result.level == CheckLevel::Ok);
        CHECK(result.detail.find("trains on " + std::to_string(devices) + " GPUs") !=
              std::string::npos);
    }
}

TEST_CASE("the tokenizer check names the vocabulary and fails for shards of another") {
    test::TempDir dir;
    NodeConfig config = local_config();
    config.swarm.train.data.dir = dir.path().string();
    CheckResult result = check_tokenizer(config);
    CHECK(result.level == CheckLevel::Ok);
    CHECK(result.detail == "bytes (256 tokens), model vocabulary 256");

    const std::string fixture =
        std::string(STARLING_SOURCE_DIR) + "/tests/data/gpt2_style_tokenizer.json";
    test::put(dir.file("tokenizer.json"), test::slurp(fixture));  // shards prepared with it
    result = check_tokenizer(config);
    CHECK(result.level == CheckLevel::Fail);
    CHECK(result.detail.find("[data].tokenizer is empty") != std::string::npos);
    CHECK(result.fix ==
          "prepare the shards with the configured tokenizer: starling data prepare --out " +
              dir.path().string());

    config.swarm.train.data.tokenizer = fixture;
    config.swarm.train.model.vocab_size = 50304;
    result = check_tokenizer(config);
    CHECK(result.level == CheckLevel::Ok);
    CHECK(result.detail ==
          "byte-level BPE " + fixture + " (50257 tokens, 14 merges), model vocabulary 50304");
}
