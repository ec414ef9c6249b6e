// A swarm node's checkpoints (daemon/swarm/swarm_checkpoint.h): the bytes written, keep, skipping
// corrupt ones, refusing another model's, and a node resumed from one.
#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/error.h"
#include "daemon/checkpoint_dir.h"
#include "daemon/swarm/swarm_checkpoint.h"
#include "daemon/swarm/swarm_node.h"
#include "daemon/swarm/swarm_snapshot.h"
#include "peer/state_sync.h"
#include "tests/support/files.h"
#include "tests/swarm/swarm_util.h"

using namespace starling;
using namespace starling::test;
namespace fs = std::filesystem;
using Catch::Contains;

namespace {

constexpr size_t kParams = 10;
const LoaderState kData{2, 17};

// The snapshot bytes of a 10-parameter model at `round`: phi[i] = i / 4, momentum[i] = -i / 2,
// adamw_m[i] = i / 8, adamw_v[i] = (i + 1) / 16, inner step 40, AdamW steps 39.
std::vector<std::byte> hand_state(uint64_t round) {
    std::vector<float> phi(kParams), momentum(kParams), m(kParams), v(kParams);
    for (size_t i = 0; i < kParams; i++) {
        phi[i] = static_cast<float>(i) / 4;
        momentum[i] = -static_cast<float>(i) / 2;
        m[i] = static_cast<float>(i) / 8;
        v[i] = static_cast<float>(i + 1) / 16;
    }
    return pack_swarm_snapshot({round, 40, 39}, phi, momentum, m, v);
}

RoundStart hand_start(uint64_t round) {
    return {
        std::make_shared<const Snapshot>("snapshot fingerprint", round, "test", hand_state(round)),
        kData};
}

std::string as_string(const std::vector<std::byte>& bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// Saves rounds first..last under root, keeping them all.
void save_rounds(const fs::path& root, uint64_t first, uint64_t last,
                 const std::string& fingerprint = "model-a") {
    for (uint64_t r = first; r <= last; r++)
        save_swarm_checkpoint(root, 100, fingerprint, hand_start(r));
}

}  // namespace

TEST_CASE("a swarm checkpoint holds the snapshot bytes, the round and the data position",
          "[swarm_checkpoint]") {
    TempDir root;
    const std::vector<std::byte> state = hand_state(5);
    REQUIRE(state.size() == 32 + 16 * kParams);
    const fs::path dir = save_swarm_checkpoint(root.path(), 3, "model-a", hand_start(5));
    CHECK(dir == root.path() / "step_00000005");
    CHECK(dir_names(root.path()) == std::vector<std::string>{"step_00000005"});
    CHECK(dir_names(dir) == std::vector<std::string>{"checkpoint.json", "state.bin"});
    CHECK(slurp(dir / "state.bin") == as_string(state));

    const nlohmann::json meta = nlohmann::json::parse(slurp(dir / "checkpoint.json"));
    CHECK(meta.at("format") == "starling-swarm-checkpoint/1");
    CHECK(meta.at("fingerprint") == "model-a");
    CHECK(meta.at("round") == 5);
    CHECK(meta.at("data_epoch") == 2);
    CHECK(meta.at("data_position") == 17);
    CHECK(meta.at("state_bytes") == 192);
    CHECK(meta.at("state_xxh3").get<std::string>().size() == 16);

    const SwarmCheckpoint back = read_swarm_checkpoint(dir, "model-a");
    CHECK(back.round == 5);
    CHECK(back.data == kData);
    CHECK(back.state == state);
    CHECK(back.path == dir);
    std::vector<float> phi(kParams), momentum(kParams), m(kParams), v(kParams);
    const SwarmCounters counters = unpack_swarm_snapshot(back.state, {phi, momentum, m, v});
    CHECK(counters.round == 5);
    CHECK(counters.inner_step == 40);
    CHECK(counters.adamw_steps == 39);
    CHECK(phi[9] == 2.25f);
    CHECK(momentum[3] == -1.5f);
    CHECK(v[0] == 0.0625f);
}

TEST_CASE("saving with keep 3 leaves the three newest rounds", "[swarm_checkpoint]") {
    TempDir root;
    for (uint64_t r = 1; r <= 5; r++)
        save_swarm_checkpoint(root.path(), 3, "model-a", hand_start(r));
    CHECK(dir_names(root.path()) ==
          std::vector<std::string>{"step_00000003", "step_00000004", "step_00000005"});
}

TEST_CASE("newest_swarm_checkpoint skips corrupt checkpoints", "[swarm_checkpoint]") {
    TempDir root;
    const fs::path r = root.path();
    SECTION("an empty or missing root holds none") {
        CHECK_FALSE(newest_swarm_checkpoint(r, "model-a"));
        CHECK_FALSE(newest_swarm_checkpoint(r / "missing", "model-a"));
    }
    save_rounds(r, 1, 3);
    const fs::path newest = r / "step_00000003";
    SECTION("whole ones: the newest") {
        const auto c = newest_swarm_checkpoint(r, "model-a");
        REQUIRE(c);
        CHECK(c->round == 3);
        CHECK(c->path == newest);
        CHECK(c->state == hand_state(3));
    }
    SECTION("one byte of state.bin flipped") {
        std::string bytes = slurp(newest / "state.bin");
        bytes[40] = static_cast<char>(bytes[40] ^ 0x01);
        put(newest / "state.bin", bytes);
        CHECK_THROWS_WITH(read_swarm_checkpoint(newest, "model-a"),
                          Contains("state.bin") && Contains("checksum"));
        const auto c = newest_swarm_checkpoint(r, "model-a");
        REQUIRE(c);
        CHECK(c->round == 2);
        CHECK(c->path == r / "step_00000002");
        CHECK(dir_names(r) ==
              std::vector<std::string>{"corrupt", "step_00000001", "step_00000002"});
        CHECK(slurp(r / "corrupt" / "step_00000003" / "state.bin") == bytes);
    }
    SECTION("state.bin truncated") {
        put(newest / "state.bin", slurp(newest / "state.bin").substr(0, 100));
        CHECK_THROWS_WITH(read_swarm_checkpoint(newest, "model-a"), Contains("100 bytes"));
        const auto c = newest_swarm_checkpoint(r, "model-a");
        REQUIRE(c);
        CHECK(c->round == 2);
    }
    SECTION("checkpoint.json not JSON") {
        put(newest / "checkpoint.json", "{\"format\": ");
        CHECK_THROWS_WITH(read_swarm_checkpoint(newest, "model-a"),
                          Contains("checkpoint.json: not valid JSON"));
        const auto c = newest_swarm_checkpoint(r, "model-a");
        REQUIRE(c);
        CHECK(c->round == 2);
    }
    SECTION(
        "every one corrupt: none, and all moved aside so new ones are not pruned in their favour") {
        for (uint64_t round = 1; round <= 3; round++)
            put(r / CheckpointDir::step_dir_name(round) / "state.bin", "");
        CHECK_FALSE(newest_swarm_checkpoint(r, "model-a"));
        CHECK(dir_names(r) == std::vector<std::string>{"corrupt"});
        CHECK(dir_names(r / "corrupt") ==
              std::vector<std::string>{"step_00000001", "step_00000002", "step_00000003"});
        // The node starts over: with keep 2, its new checkpoints are the ones kept.
        for (uint64_t round = 1; round <= 2; round++)
            save_swarm_checkpoint(r, 2, "model-a", hand_start(round));
        CHECK(dir_names(r) ==
              std::vector<std::string>{"corrupt", "step_00000001", "step_00000002"});
        REQUIRE(newest_swarm_checkpoint(r, "model-a"));
        CHECK(newest_swarm_checkpoint(r, "model-a")->round == 2);
        // A second corrupt step 3 goes beside the first.
        save_swarm_checkpoint(r, 5, "model-a", hand_start(3));
        put(r / "step_00000003" / "state.bin", "");
        CHECK(newest_swarm_checkpoint(r, "model-a")->round == 2);
        CHECK(dir_names(r / "corrupt") == std::vector<std::string>{"step_00000001", "step_00000002",
                                                                   "step_00000003",
                                                                   "step_00000003.1"});
    }
}

TEST_CASE("a checkpoint of another model is refused, never skipped", "[swarm_checkpoint]") {
    TempDir root;
    save_rounds(root.path(), 1, 1, "model-a");
    save_rounds(root.path(), 2, 2, "model-b");
    const fs::path foreign = root.path() / "step_00000002";
    CHECK_THROWS_AS(read_swarm_checkpoint(foreign, "model-a"), CheckpointOfAnotherModel);
    CHECK_THROWS_WITH(read_swarm_checkpoint(foreign, "model-a"),
                      Contains("model-a") && Contains("model-b") && Contains("[node].data_dir"));
    // Even with a checkpoint of this model below it.
    CHECK_THROWS_AS(newest_swarm_checkpoint(root.path(), "model-a"), CheckpointOfAnotherModel);
    CHECK_THROWS_WITH(newest_swarm_checkpoint(root.path(), "model-a"),
                      Contains("model-b") && Contains("model-a") && Contains("[node].data_dir"));
}

TEST_CASE("a node resumed from a checkpoint holds the round start it saved", "[swarm_checkpoint]") {
    TempDir data, checkpoints;
    SwarmConfig config = pico_swarm(4);
    // One node key for both, as a restarted daemon has: the same node id, so the same data order.
    config.peer.data_dir = data.path();
    SwarmNode first(config);
    first.run_round();
    first.run_round();
    REQUIRE(first.round() == 2);
    const RoundStart start = first.round_start();
    REQUIRE_FALSE(start.data == LoaderState{});  // it has read data, so the position says something
    const std::string fingerprint = first.replica().manifest().fingerprint();
    const fs::path dir = save_swarm_checkpoint(checkpoints.path(), 3, fingerprint, start);
    CHECK(dir.filename() == "step_00000002");
    const SwarmCheckpoint saved = read_swarm_checkpoint(dir, fingerprint);
    CHECK(saved.data == first.replica().data().state());

    SwarmNode second(config);
    REQUIRE(second.node_id() == first.node_id());
    second.resume(saved.state, saved.data);
    Replica& a = first.replica();
    Replica& b = second.replica();
    CHECK(second.round() == 2);
    CHECK(second.inner_step() == 2 * kInnerSteps);
    CHECK(second.inner_step() == first.inner_step());
    CHECK(b.adamw_steps() == a.adamw_steps());
    CHECK(same_bits(b.phi(), a.phi()));
    CHECK(same_bits(b.momentum(), a.momentum()));
    CHECK(same_bits(b.adamw_m_host(), a.adamw_m_host()));
    CHECK(same_bits(b.adamw_v_host(), a.adamw_v_host()));
    CHECK(same_bits(b.theta(), b.phi()));
    CHECK(b.data().state() == start.data);
    CHECK(second.round_start().data == start.data);
    CHECK(std::ranges::equal(second.round_start().snapshot->bytes(), saved.state));

    // The next round continues bit for bit where the first node's does.
    first.run_round();
    second.run_round();
    CHECK(same_bits(b.phi(), a.phi()));
    CHECK(b.data().state() == a.data().state());

    // Bytes of the wrong size are refused and leave the node as it was.
    const uint64_t round = second.round();
    const LoaderState position = b.data().state();
    std::vector<std::byte> short_state(saved.state.begin(), saved.state.end() - 4);
    CHECK_THROWS_AS(second.resume(short_state, {0, 3}), Error);
    CHECK(second.round() == round);
    CHECK(b.data().state() == position);
    CHECK(same_bits(b.phi(), a.phi()));
}
