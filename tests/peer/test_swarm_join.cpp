// A joiner catching up through its PeerNode: the donors are the live members of its swarm, each
// serving StateSync on its peer port, and they keep publishing new snapshots (training on) while
// the joiner fetches.
#include <catch2/catch.hpp>
#include <mutex>
#include <random>

#include "common/error.h"
#include "peer/local_cluster.h"
#include "tests/peer/cluster_util.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

constexpr uint32_t kChunk = 64u << 10;
constexpr uint64_t kTotal = 48 * kChunk + 777;  // 49 chunks, the last one short

// The training state after `round` rounds; the same on every donor, as phi is under DiLoCo.
std::vector<std::byte> state_of_round(uint64_t round) {
    std::mt19937_64 rng(round);
    std::vector<std::byte> bytes(kTotal);
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
    return bytes;
}

// Publishes round after round on every donor, every `period`, until stopped: the swarm training on.
class Trainer {
public:
    Trainer(std::vector<PeerNode*> donors, std::chrono::milliseconds period)
        : donors_(std::move(donors)) {
        publish(round_);
        thread_ = std::thread([this, period] {
            std::unique_lock lock(mutex_);
            while (!stop_.wait_for(lock, period, [&] { return stopped_; })) publish(++round_);
        });
    }
    ~Trainer() {
        {
            std::lock_guard lock(mutex_);
            stopped_ = true;
        }
        stop_.notify_all();
        thread_.join();
    }
    uint64_t round() const { return round_; }

private:
    void publish(uint64_t round) {
        const auto snapshot = std::make_shared<Snapshot>(
            "local", round, "round " + std::to_string(round), state_of_round(round), kChunk);
        for (PeerNode* donor : donors_) donor->snapshots().publish(snapshot);
    }

    std::vector<PeerNode*> donors_;
    std::atomic<uint64_t> round_{1};
    std::mutex mutex_;
    std::condition_variable stop_;
    bool stopped_ = false;
    std::thread thread_;
};

}  // namespace

TEST_CASE("a joiner fetches a verified snapshot from the live members while they keep training") {
    PeerConfig base = local_cluster_config();
    base.snapshots_kept = 4;
    LocalCluster cluster(3, base);
    Trainer trainer(nodes_of(cluster), 100ms);

    PeerConfig joiner_config = base;
    joiner_config.seeds = {cluster.node(0).address()};
    PeerNode& joiner = cluster.add(joiner_config);
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms, [&] { return all_see_all_alive(nodes); });

    std::vector<std::byte> state(kTotal);
    FetchOptions options;
    options.call_timeout = 2000ms;
    // A slow joiner: a few chunks in, it waits until the others have published two new rounds.
    // Counted from the round then, not from before the fetch: the snapshot it fetches is of that
    // round at most, and may be newer than the one published when the fetch began.
    options.progress = [&](uint32_t done, uint32_t) {
        if (done != 10) return;
        const uint64_t round_then = trainer.round();
        wait_for("two more rounds", 3000ms, [&] { return trainer.round() >= round_then + 2; });
    };
    const FetchResult result = joiner.fetch_state({"local", kTotal}, state, options);
    CHECK(result.manifest.metadata == "round " + std::to_string(result.manifest.round));
    CHECK(state == state_of_round(result.manifest.round));
    CHECK(trainer.round() >= result.manifest.round + 2);  // the others trained on meanwhile
    // Several members served a share at once (all three, unless one was slow to answer on a busy
    // machine).
    CHECK(result.chunks_per_donor.size() >= 2);
}

TEST_CASE("a joiner survives its donors dying midway") {
    LocalCluster cluster(3);
    Trainer trainer(nodes_of(cluster), 10s);  // one snapshot, so the joiner's target stays put
    PeerConfig joiner_config = local_cluster_config();
    joiner_config.seeds = {cluster.node(0).address()};
    PeerNode& joiner = cluster.add(joiner_config);
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms, [&] { return all_see_all_alive(nodes); });

    std::vector<std::byte> state(kTotal);
    std::once_flag killed;
    FetchOptions options;
    options.call_timeout = 1000ms;
    options.inflight_per_donor = 1;
    options.progress = [&](uint32_t done, uint32_t) {
        // Two of the three donors die a few chunks in; the fetch finishes from the third. Every
        // fetching thread waits here until both are dead, however slowly the machine runs.
        if (done < 6) return;
        std::call_once(killed, [&] {
            cluster.node(1).kill();
            cluster.node(2).kill();
        });
    };
    const FetchResult result = joiner.fetch_state({"local", kTotal}, state, options);
    CHECK(state == state_of_round(result.manifest.round));
    const std::string survivor = cluster.node(0).address();
    REQUIRE(result.chunks_per_donor.count(survivor) == 1);
    CHECK(result.chunks_per_donor.at(survivor) > result.manifest.chunk_count() / 3);
}

TEST_CASE("a joiner with no live member of its model is told there is no donor") {
    LocalCluster cluster(1);
    std::vector<std::byte> state(kTotal);
    REQUIRE_THROWS_WITH(cluster.node(0).fetch_state({"local", kTotal}, state),
                        Catch::Contains("no live member runs this model"));
}

TEST_CASE("a joiner never asks a private member for its state, and says so when only they are") {
    LocalCluster cluster(1);
    PeerNode& hidden = add_private_node(cluster);
    // Probed through its anchor (this node) from then on, so it stays pairable.
    wait_for("the member seen private, anchored here and pairable", 30000ms, [&] {
        for (const Member& m : cluster.node(0).members())
            if (m.node_id == hidden.node_id())
                return m.reachability == Reachability::Private && !m.anchors.empty() &&
                       cluster.node(0).pairable_ids().size() == 2;
        return false;
    });
    std::vector<std::byte> state(kTotal);
    REQUIRE_THROWS_WITH(cluster.node(0).fetch_state({"local", kTotal}, state),
                        Catch::Contains("every live member that runs this model (1) is private"));
}
