// starlingd's config (daemon/swarm/node_config.h): the shipped files, environment overrides,
// errors that name the key, and the flags on top.
#include <catch2/catch.hpp>

#include <cmath>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "daemon/config.h"
#include "daemon/swarm/node_config.h"
#include "tests/support/config_keys.h"
#include "tests/support/files.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

const fs::path kConfigs = fs::path(STARLING_SOURCE_DIR) / "configs";

// Sets (or, with nullopt, unsets) an environment variable for one scope, then puts it back.
class ScopedEnv {
public:
    ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        value ? ::setenv(name, value->c_str(), 1) : ::unsetenv(name);
    }
    ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    const char* name_;
    std::optional<std::string> old_;
};

// No secret from the environment, whatever the shell running the tests holds.
struct NoSecretInEnv {
    ScopedEnv secret{"STARLING_PEER_SECRET", std::nullopt};
    ScopedEnv secret_file{"STARLING_PEER_SECRET_FILE", std::nullopt};
};

// configs/pico.toml with `from` (which must occur exactly once) replaced by `to`, in a temp file.
struct EditedPico {
    TempDir dir;
    fs::path path = dir.file("node.toml");
    EditedPico(const std::string& from, const std::string& to) {
        std::string text = slurp(kConfigs / "pico.toml");
        const size_t at = text.find(from);
        REQUIRE(at != std::string::npos);
        REQUIRE(text.find(from, at + 1) == std::string::npos);
        put(path, text.replace(at, from.size(), to));
    }
    NodeConfig load() const { return load_node_config(path); }
};

}  // namespace

TEST_CASE("the shipped configs load as node configs with their documented values",
          "[node_config]") {
    const ScopedEnv secret("STARLING_PEER_SECRET", "s3cret");
    const NodeConfig pico = load_node_config(kConfigs / "pico.toml");
    CHECK(pico.config_path == kConfigs / "pico.toml");
    CHECK(pico.swarm.train.model.n_layer == 2);
    CHECK(pico.swarm.inner_steps == 20);
    CHECK(pico.swarm.method == OuterMethod::NoLoCo);
    CHECK(pico.swarm.exchange.state_codec == codec::Codec::Q8);
    CHECK(pico.swarm.outer.pull == 0.7f);
    CHECK(pico.data_dir == fs::path("out/node"));
    CHECK(pico.checkpoint_dir() == fs::path("out/node") / "checkpoints");
    CHECK(pico.swarm.peer.data_dir == pico.data_dir);
    CHECK(pico.log_level == "info");
    CHECK(pico.checkpoint_every == 10);
    CHECK(pico.swarm.peer.listen == "0.0.0.0:7700");
    CHECK(pico.swarm.peer.swarm_secret == "s3cret");
    CHECK(pico.swarm.peer.exchange_timeout == 10000ms);
    CHECK(pico.control_listen == "127.0.0.1:7701");
    CHECK(pico.metrics_listen == "127.0.0.1:9464");

    const NodeConfig nano = load_node_config(kConfigs / "nano.toml");
    CHECK(nano.swarm.train.model.n_layer == 4);
    CHECK(nano.swarm.inner_steps == 50);
    CHECK(nano.swarm.peer.exchange_timeout == 10000ms);
    const NodeConfig m124 = load_node_config(kConfigs / "124m.toml");
    CHECK(m124.swarm.train.model.context == 1024);
    CHECK(m124.swarm.inner_steps == 100);
    CHECK(m124.checkpoint_every == 5);
    CHECK(m124.swarm.peer.exchange_timeout == 30000ms);
}

TEST_CASE("starling train's load_train_config still reads pico.toml beside the daemon's sections",
          "[node_config]") {
    const NoSecretInEnv no_secret;
    const TrainConfig c = load_train_config((kConfigs / "pico.toml").string());
    CHECK(c.model.n_layer == 2);
    CHECK(c.steps == 1000);
    CHECK(c.checkpoint_every == 500);
    CHECK(c.run_dir == "out/runs/pico");
}

TEST_CASE("node config: the swarm secret", "[node_config]") {
    const NoSecretInEnv no_secret;
    SECTION("none and no TLS is refused, naming [peer].secret") {
        CHECK_THROWS_WITH(load_node_config(kConfigs / "pico.toml"),
                          Contains((kConfigs / "pico.toml").string()) && Contains("[peer].secret"));
    }
    TempDir dir;
    SECTION("secret_file: its text without the trailing newline") {
        put(dir.file("secret"), "abc\n");
        const EditedPico f("secret = \"\"",
                           "secret_file = \"" + dir.file("secret").string() + "\"");
        CHECK(f.load().swarm.peer.swarm_secret == "abc");
    }
    SECTION("a missing secret_file is refused naming its path") {
        const std::string missing = dir.file("no-such-secret").string();
        const EditedPico f("secret = \"\"", "secret_file = \"" + missing + "\"");
        CHECK_THROWS_WITH(f.load(), Contains("[peer].secret_file") && Contains(missing));
    }
    SECTION("secret and secret_file both set are refused") {
        put(dir.file("secret"), "abc\n");
        const EditedPico f("secret = \"\"",
                           "secret = \"x\"\nsecret_file = \"" + dir.file("secret").string() + "\"");
        CHECK_THROWS_WITH(f.load(), Contains("[peer].secret and [peer].secret_file are both set"));
    }
}

TEST_CASE("node config: STARLING_<SECTION>_<KEY> overrides the file", "[node_config]") {
    const ScopedEnv secret("STARLING_PEER_SECRET", "s3cret");
    const fs::path pico = kConfigs / "pico.toml";
    SECTION("seeds, as a TOML array") {
        const ScopedEnv seeds("STARLING_PEER_SEEDS", R"(["10.0.0.1:7700","10.0.0.2:7700"])");
        CHECK(load_node_config(pico).swarm.peer.seeds ==
              std::vector<std::string>{"10.0.0.1:7700", "10.0.0.2:7700"});
    }
    SECTION("inner steps") {
        const ScopedEnv steps("STARLING_SWARM_INNER_STEPS", "7");
        CHECK(load_node_config(pico).swarm.inner_steps == 7);
    }
    SECTION("malformed seeds name the variable") {
        const char* value = GENERATE("[1,2]", "not toml");
        const ScopedEnv seeds("STARLING_PEER_SEEDS", value);
        CHECK_THROWS_WITH(load_node_config(pico), Contains("STARLING_PEER_SEEDS"));
    }
}

TEST_CASE("node config errors name the key", "[node_config]") {
    const ScopedEnv secret("STARLING_PEER_SECRET", "s3cret");
    SECTION("unknown key") {
        const EditedPico f("[peer]\n", "[peer]\nlistn = \"0.0.0.0:7700\"\n");
        CHECK_THROWS_WITH(f.load(),
                          Contains(f.path.string()) && Contains("unknown key [peer].listn"));
    }
    SECTION("unknown section") {
        const EditedPico f("[metrics]\n", "[nodes]\nx = 1\n[metrics]\n");
        CHECK_THROWS_WITH(f.load(), Contains("unknown section [nodes]"));
    }
    SECTION("method diloco is read") {
        const EditedPico f("method = \"noloco\"", "method = \"diloco\"");
        CHECK(f.load().swarm.method == OuterMethod::DiLoCo);
    }
    SECTION("overlap is on in the shipped config and can be turned off") {
        CHECK(load_node_config(kConfigs / "pico.toml").swarm.overlap);
        const EditedPico f("overlap = true ", "overlap = false ");
        CHECK_FALSE(f.load().swarm.overlap);
    }
    SECTION("round_seconds is read, and a negative one refused") {
        const EditedPico f("round_seconds = 0 ", "round_seconds = 2.5 ");
        CHECK(f.load().swarm.round_seconds == 2.5);
        const EditedPico negative("round_seconds = 0 ", "round_seconds = -1 ");
        CHECK_THROWS_WITH(negative.load(), Contains("[swarm].round_seconds"));
    }
    SECTION(
        "uneven_margin is read (0.25 by default, inf for rounds of H steps always), and a "
        "negative one refused") {
        CHECK(load_node_config(kConfigs / "pico.toml").swarm.uneven_margin == 0.25);
        const EditedPico always_h("uneven_margin = 0.25 ", "uneven_margin = inf ");
        CHECK(std::isinf(always_h.load().swarm.uneven_margin));
        const EditedPico negative("uneven_margin = 0.25 ", "uneven_margin = -0.1 ");
        CHECK_THROWS_WITH(negative.load(), Contains("[swarm].uneven_margin"));
    }
    SECTION("an unknown method") {
        const EditedPico f("method = \"noloco\"", "method = \"bogus\"");
        CHECK_THROWS_WITH(f.load(), Contains("method \"bogus\" is not known"));
    }
    SECTION("a non-local control address needs allow_remote") {
        const EditedPico f("listen = \"127.0.0.1:7701\"", "listen = \"0.0.0.0:7701\"");
        CHECK_THROWS_WITH(
            f.load(), Contains("[control].listen \"0.0.0.0:7701\"") && Contains("allow_remote"));
        const EditedPico allowed("listen = \"127.0.0.1:7701\"",
                                 "listen = \"0.0.0.0:7701\"\nallow_remote = true");
        const NodeConfig c = allowed.load();
        CHECK(c.control_listen == "0.0.0.0:7701");
        CHECK(c.control_allow_remote);
    }
    SECTION("log level") {
        const EditedPico f("log_level = \"info\"", "log_level = \"loud\"");
        CHECK_THROWS_WITH(f.load(), Contains("[node].log_level \"loud\""));
    }
    SECTION("negative checkpoint_every") {
        const EditedPico f("checkpoint_every = 10", "checkpoint_every = -1");
        CHECK_THROWS_WITH(f.load(), Contains("[swarm].checkpoint_every must not be negative"));
    }
    SECTION("log format") {
        const EditedPico f("log_format = \"text\"", "log_format = \"xml\"");
        CHECK_THROWS_WITH(f.load(), Contains("[node].log_format \"xml\" is not text or json"));
        CHECK(EditedPico("log_format = \"text\"", "log_format = \"json\"").load().log_format ==
              "json");
    }
    SECTION(
        "the deadlines for slow links: read in their units, a ceiling below its floor refused") {
        const EditedPico f("max_round_gap = 1",
                           "exchange_timeout_max_ms = 120000\nmin_link_mbit = 2.5\n"
                           "state_sync_timeout_ms = 5000\nstate_sync_timeout_max_ms = 60000\n"
                           "state_sync_min_link_mbit = 0.5\nmax_round_gap = 1");
        const PeerConfig p = f.load().swarm.peer;
        CHECK(p.exchange_timeout_max == 120000ms);
        CHECK(p.min_link_bytes_per_s == Approx(312500.0));
        CHECK(p.state_sync_timeout == 5000ms);
        CHECK(p.state_sync_timeout_max == 60000ms);
        CHECK(p.state_sync_min_link_bytes_per_s == Approx(62500.0));
        const EditedPico low("max_round_gap = 1",
                             "exchange_timeout_max_ms = 5000\nmax_round_gap = 1");
        CHECK_THROWS_WITH(
            low.load(),
            Contains("[peer].exchange_timeout_max_ms must be at least exchange_timeout_ms"));
        const EditedPico sync("max_round_gap = 1",
                              "state_sync_timeout_max_ms = 5000\nmax_round_gap = 1");
        CHECK_THROWS_WITH(
            sync.load(),
            Contains("[peer].state_sync_timeout_max_ms must be at least state_sync_timeout_ms"));
        const EditedPico zero("max_round_gap = 1", "min_link_mbit = 0\nmax_round_gap = 1");
        CHECK_THROWS_WITH(zero.load(), Contains("[peer].min_link_mbit must be above 0"));
    }
}

TEST_CASE("apply_node_flags replaces what is given, appends seeds and moves the peer data dir",
          "[node_config]") {
    const ScopedEnv secret("STARLING_PEER_SECRET", "s3cret");
    const ScopedEnv seeds("STARLING_PEER_SEEDS", R"(["10.0.0.1:7700"])");
    NodeConfig c = load_node_config(kConfigs / "pico.toml");
    apply_node_flags({}, c);  // nothing given: nothing changes
    CHECK(c.data_dir == fs::path("out/node"));
    CHECK(c.swarm.peer.seeds == std::vector<std::string>{"10.0.0.1:7700"});

    NodeFlags flags;
    flags.data_dir = "/var/lib/starling";
    flags.listen = "0.0.0.0:7800";
    flags.announce = "10.0.0.9:7800";
    flags.control = "unix:/run/starling/control.sock";
    flags.metrics = "";
    flags.log_level = "debug";
    flags.seeds = {"10.0.0.2:7700", "10.0.0.3:7700"};
    apply_node_flags(flags, c);
    CHECK(c.data_dir == fs::path("/var/lib/starling"));
    CHECK(c.checkpoint_dir() == fs::path("/var/lib/starling/checkpoints"));
    CHECK(c.swarm.peer.data_dir == fs::path("/var/lib/starling"));
    CHECK(c.swarm.peer.listen == "0.0.0.0:7800");
    CHECK(c.swarm.peer.announce == "10.0.0.9:7800");
    CHECK(c.control_listen == "unix:/run/starling/control.sock");
    CHECK(c.metrics_listen.empty());
    CHECK(c.log_level == "debug");
    CHECK(c.swarm.peer.seeds ==
          std::vector<std::string>{"10.0.0.1:7700", "10.0.0.2:7700", "10.0.0.3:7700"});

    NodeFlags bad;
    bad.control = "0.0.0.0:7701";
    CHECK_THROWS_WITH(apply_node_flags(bad, c), Contains("[control].listen"));
}

TEST_CASE("is_local_listen_address", "[node_config]") {
    for (const char* local : {"unix:/x", "127.0.0.1:1", "127.8.9.10:1", "[::1]:1", "localhost:1"}) {
        INFO(local);
        CHECK(is_local_listen_address(local));
    }
    for (const char* remote :
         {"0.0.0.0:1", "10.1.2.3:1", "example.com:1", "[::]:1", "128.0.0.1:1"}) {
        INFO(remote);
        CHECK_FALSE(is_local_listen_address(remote));
    }
}

TEST_CASE("a node file of every declared key at its shown value reads each into its own field") {
    NoSecretInEnv no_secret;
    TempDir dir;
    const fs::path path = dir.file("node.toml");
    // The operators' defaults, then every kind of key changed: milliseconds, Mbit/s, a name, a
    // path, a list, and [eval] every, which starlingd takes and ignores.
    const std::vector<KeyDescription> defaults = node_config_keys();
    put(path, toml_of(defaults));
    check_same_values(node_config_keys(load_node_config(path, NodeConfigUse::ReadCheckpoints)),
                      defaults);

    NodeConfig changed = load_node_config(path, NodeConfigUse::ReadCheckpoints);
    changed.swarm.peer.pair_timeout = 1234ms;
    changed.swarm.peer.min_link_bytes_per_s = 1e6;  // 8 Mbit/s
    changed.swarm.method = OuterMethod::DiLoCo;
    changed.data_dir = "somewhere";
    changed.swarm.peer.seeds = {"a:1", "b:2"};
    changed.swarm.peer.swarm_secret = "s3cret";
    const std::vector<KeyDescription> keys = node_config_keys(changed);
    std::string text = toml_of(keys);
    text.replace(text.find("[eval]\n"), 7, "[eval]\nevery = 250\n");
    put(path, text);
    const NodeConfig loaded = load_node_config(path);
    check_same_values(node_config_keys(loaded), keys);
    CHECK(loaded.swarm.peer.pair_timeout == 1234ms);
    CHECK(loaded.swarm.peer.min_link_bytes_per_s == Approx(1e6));
    CHECK(loaded.swarm.method == OuterMethod::DiLoCo);
    CHECK(loaded.swarm.peer.seeds == std::vector<std::string>{"a:1", "b:2"});
}

TEST_CASE("a node key outside its declared range names the key and the range") {
    EditedPico short_pair("pair_timeout_ms = 5000", "pair_timeout_ms = 5");
    CHECK_THROWS_WITH(short_pair.load(), Contains("[peer].pair_timeout_ms must be at least 10"));
    EditedPico ddp("method = \"noloco\"", "method = \"ddp\"");
    CHECK_THROWS_WITH(ddp.load(),
                      Contains("method \"ddp\"") && Contains("noloco, diloco or local"));
}
