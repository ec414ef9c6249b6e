// One member with a mistyped learning rate among honest starlingd processes (the config typo of
// docs/spec.md's sane() and DiLoCo's clip and direction test): its messages are refused, and the
// honest nodes keep finite weights and learn. Before those defences one partner's message at a
// learning rate of 1e2 was averaged in during the first rounds, and the honest nodes ended NaN. A
// fresh node joining such a swarm refuses the faulty member's state
// (daemon/swarm/snapshot_check.h); before that check it copied whichever snapshot won the race, the
// faulty one's included. A member that trains honestly but sends sign-flipped messages
// (faulty_starlingd, tests/integration/faulty_daemon/) is refused alike, and the honest nodes
// beside a mistyped learning rate end near a control swarm of their own.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <regex>
#include <signal.h>
#include <sstream>
#include <string>
#include <vector>

#include "optimizer/outer_round.h"
#include "tests/integration/daemon_harness.h"
#include "tests/support/files.h"

using namespace starling::test;
using namespace std::chrono_literals;

namespace {

constexpr uint64_t kRounds = 40;

bool status_has(const TestDaemon& daemon, const char* key) {
    try {
        return daemon.status().contains(key);
    } catch (const std::exception&) {
        return false;
    }
}

// The log's lines that hold every one of `words`.
std::vector<std::string> lines_with(const std::string& log, const std::vector<std::string>& words) {
    std::vector<std::string> found;
    std::istringstream in(log);
    std::string line;
    while (std::getline(in, line))
        if (std::all_of(words.begin(), words.end(),
                        [&](const std::string& w) { return line.find(w) != std::string::npos; }))
            found.push_back(line);
    return found;
}

// The mean of the validation losses evaluated in the last half of `rounds` (NaN without one); one
// evaluation is noisy (pico daemons' swing by 1% from one to the next).
double window_mean(const std::map<uint64_t, double>& losses, uint64_t rounds) {
    double sum = 0.0;
    int count = 0;
    for (const auto& [round, loss] : losses) {
        if (round > rounds / 2 && round <= rounds) {
            sum += loss;
            count++;
        }
    }
    return count > 0 ? sum / count : std::numeric_limits<double>::quiet_NaN();
}

bool trained_to_nan(const std::string& log) {
    return log.find("| loss nan") != std::string::npos ||
           log.find("| loss -nan") != std::string::npos;
}

struct FaultyRun {
    std::string logs;  // the honest nodes', joined
    // Per honest node, what its `starling peers` said of the faulty member at the end.
    std::vector<nlohmann::json> views_of_faulty;
    std::string faulty_address;
    uint64_t honest_refused = 0;  // honest members' messages the honest nodes refused
    // The mean of the honest nodes' validation losses over the last half of the run's rounds.
    double honest_val_loss = 0.0;
};

// Three honest daemons and one whose config differs by `fault` (environment overrides) or that
// runs `faulty_command` (faulty_starlingd with a fault), all with `method`, evaluated every 8
// rounds, with `everyone`'s settings on all four; without a fourth (`fourth` false), a control
// swarm of the three. Each honest node must reach `rounds` with a finite validation loss and a
// training loss well below its first.
FaultyRun run_with_faulty_member(const std::string& method, const Environment& fault,
                                 const std::vector<std::string>& faulty_command = {},
                                 uint64_t rounds = kRounds, bool fourth = true,
                                 const Environment& everyone = {}) {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path()), c("c", root.path()),
        faulty("faulty", root.path());
    // H-step rounds always: on a busy machine the members' step times spread and automatic rounds
    // turn to time budgets, where members train unequal tokens and NoLoCo's held-out check does
    // not judge (an honest partner with fewer steps scores worse); those rounds are sane()'s alone.
    Environment honest{{"STARLING_SWARM_METHOD", method},
                       {"STARLING_SWARM_EVAL_EVERY", "8"},
                       {"STARLING_SWARM_UNEVEN_MARGIN", "inf"}};
    for (const auto& [key, value] : everyone) honest[key] = value;
    Environment typo = honest;
    for (const auto& [key, value] : fault) typo[key] = value;
    if (!faulty_command.empty()) faulty.run_as(faulty_command);
    a.start({}, honest);
    b.start({a.peer_address()}, honest);
    c.start({a.peer_address()}, honest);
    if (fourth) faulty.start({a.peer_address()}, typo);
    FaultyRun run{"", {}, faulty.peer_address()};
    for (TestDaemon* d : {&a, &b, &c}) {
        eventually(d->name() + " reaches round " + std::to_string(rounds), 600s, [&] {
            const std::string log = d->log();
            if (trained_to_nan(log)) FAIL(d->name() << " trained to NaN\n" << daemon_log_tails());
            if (!d->process().running())
                FAIL(d->name() << " exited before round " << rounds << "\n" << daemon_log_tails());
            const auto logged = method == "diloco" ? logged_diloco_rounds(log) : logged_rounds(log);
            return !logged.empty() && logged.back().round >= rounds;
        });
        const auto logged =
            method == "diloco" ? logged_diloco_rounds(d->log()) : logged_rounds(d->log());
        INFO(d->name() << "'s first and last training loss: " << logged.front().loss << ", "
                       << logged.back().loss);
        CHECK(std::isfinite(logged.back().loss));
        CHECK(logged.back().loss < logged.front().loss - 0.5);
        const nlohmann::json status = d->status();
        REQUIRE(status.contains("val_loss"));
        INFO(d->name() << "'s validation loss: " << status["val_loss"]);
        CHECK(std::isfinite(status["val_loss"].get<double>()));
        CHECK(status["val_loss"].get<double>() < 4.0);  // ln 256 = 5.55 untrained
        run.honest_val_loss += window_mean(logged_val_losses(d->log()), rounds) / 3.0;
        run.logs += d->log();
    }
    if (!fourth) {
        for (TestDaemon* d : {&a, &b, &c}) d->process().signal(SIGTERM);
        for (TestDaemon* d : {&a, &b, &c}) d->process().wait(20s);
        return run;
    }
    const std::string faulty_id = faulty.status()["node_id"];
    for (TestDaemon* d : {&a, &b, &c}) {
        const nlohmann::json peers = d->peers();
        for (const nlohmann::json& p : peers["peers"]) {
            if (p["node_id"] == faulty_id)
                run.views_of_faulty.push_back(p);
            else if (p.contains("refused_messages"))
                run.honest_refused += json_u64(p["refused_messages"]);
        }
    }
    for (TestDaemon* d : {&a, &b, &c, &faulty}) d->process().signal(SIGTERM);
    for (TestDaemon* d : {&a, &b, &c, &faulty}) d->process().wait(20s);
    return run;
}

// Shards an operator could prepare by mistake from a file of random bytes, through the real CLI.
std::string random_byte_shards(const std::filesystem::path& root) {
    const std::filesystem::path text = root / "random.bin", shards = root / "random-shards";
    std::string bytes(400000, '\0');
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (char& c : bytes) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        c = static_cast<char>(state >> 56);
    }
    put(text, bytes);
    const CommandResult prepared = run_command(
        {starling_binary(), "data", "prepare", "--input", text.string(), "--out", shards.string()});
    INFO(prepared.output);
    REQUIRE(prepared.status == 0);
    return shards.string();
}

// The faulty member is refused when it is paired or gathered, quarantined and named; the honest
// members refuse few of each other's messages. Few, not none: pico daemons early in training
// drift apart, and an honest partner's weights scored up to 15% worse than a node's own on the
// held-out batch, where a decaying member's scored 6 to 25% worse: 0 to 4 refusals in about 80
// honest judgements in 22 runs beside a member trained on random bytes, and 6 in one clean-clone
// run beside a decaying one, under ctest -j2 (those its output kept: honest partners at 1.051 and
// 1.058 of the node's own loss, in rounds 4 and 9). The bound holds that, not the study's 1%
// (0 of 288 honest messages refused at H 50, docs/security.md). In DiLoCo the staleness test left
// out 3 honest D's in 8 runs beside a member trained on random bytes (2 refusals each: an honest D
// 0.28 above the median of three, and the first D's of a swarm that two members began alone and two
// joined, where the old member's D follows the last step it made half of); before it judged only
// the D's the direction test kept, the random-byte member set the median, and one run counted 6.
void check_named_and_quarantined(const FaultyRun& run) {
    INFO(run.logs);
    CHECK(!lines_with(run.logs, {"warn", run.faulty_address, "quarantined until round"}).empty());
    REQUIRE(run.views_of_faulty.size() == 3);
    CHECK(run.honest_refused <= 8);
}

// The round lines that refused a partner on the held-out batch: each logs that partner's score,
// the ratio of the two losses its refusal names, above the bound.
size_t check_logged_held_out_scores(const std::string& logs) {
    static const std::regex refusal(
        R"(\| held-out ([0-9.]+) of own .*its weights score ([0-9.]+) on a held-out batch, more )"
        R"(than [0-9.]+ times this node's own ([0-9.]+))");
    size_t count = 0;
    std::istringstream in(logs);
    std::string line;
    std::smatch m;
    while (std::getline(in, line)) {
        if (!std::regex_search(line, m, refusal)) continue;
        INFO(line);
        CHECK(std::stod(m[1]) == Approx(std::stod(m[2]) / std::stod(m[3])).margin(1e-3));
        // The log prints three decimals: a ratio just above the bound reads as the bound itself.
        CHECK(std::stod(m[1]) >= starling::kMaxHeldOutLossRatio - 0.5e-3);
        count++;
    }
    return count;
}

}  // namespace

TEST_CASE(
    "a NoLoCo member whose learning rate is mistyped 1e2 is refused, quarantined and named, and "
    "sinks no one",
    "[integration]") {
    const FaultyRun run = run_with_faulty_member("noloco", {{"STARLING_OPTIMIZER_LR", "1e2"}});
    // Pairing is random, but in 40 rounds of 4 members an honest node meets the faulty one.
    CHECK((run.logs.find("exceeds 10.000000 times the larger of this node's own update") !=
               std::string::npos ||
           run.logs.find("is not finite") != std::string::npos));
    // Two refusals in a row quarantine it for 8 rounds, then 16, then 32: in 40 rounds an honest
    // node refuses it a handful of times, where without the quarantine it would keep pairing with
    // it about one round in three. Each honest node says how many it refused.
    REQUIRE(run.views_of_faulty.size() == 3);
    uint64_t refused = 0;
    for (const nlohmann::json& view : run.views_of_faulty) {
        INFO(view.dump());
        const uint64_t n =
            view.contains("refused_messages") ? json_u64(view["refused_messages"]) : 0;
        CHECK(n <= 6);
        refused += n;
    }
    CHECK(refused >= 2);
    const auto quarantines =
        lines_with(run.logs, {"warn", run.faulty_address, "quarantined until round"});
    INFO(run.logs);
    CHECK(!quarantines.empty());
}

TEST_CASE(
    "a DiLoCo member whose learning rate is mistyped 1e3 is left out, quarantined and named, and "
    "sinks no one",
    "[integration]") {
    const FaultyRun run = run_with_faulty_member("diloco", {{"STARLING_OPTIMIZER_LR", "1e3"}});
    // Every member judges the same D's alike: the faulty one's is not finite, far above the
    // median norm or pointing away from the others' sum, and left out. The gather still takes it
    // (so every member averages the same ones); the judgements name and quarantine its author.
    INFO(run.logs);
    CHECK((run.logs.find("its D points away from the others'") != std::string::npos ||
           run.logs.find("times the norm allowed it") != std::string::npos ||
           run.logs.find("its D is not finite") != std::string::npos));
    CHECK(!lines_with(run.logs, {"warn", run.faulty_address, "quarantined until round"}).empty());
    REQUIRE(run.views_of_faulty.size() == 3);
    for (const nlohmann::json& view : run.views_of_faulty) {
        INFO(view.dump());
        CHECK(view.contains("refused_messages"));
    }
}

TEST_CASE("a DiLoCo member whose weight decay is mistyped 30 is left out, quarantined and named",
          "[integration]") {
    // Its weights shrink towards zero: its D is of an ordinary norm, so the clip passes it, but it
    // points against the others' and the direction test leaves it out.
    const FaultyRun run =
        run_with_faulty_member("diloco", {{"STARLING_OPTIMIZER_WEIGHT_DECAY", "30"}});
    INFO(run.logs);
    CHECK(run.logs.find("its D points away from the others'") != std::string::npos);
    CHECK(!lines_with(run.logs, {"warn", run.faulty_address, "quarantined until round"}).empty());
}

TEST_CASE(
    "a fresh node refuses the state of a member whose learning rate is mistyped 1e2, naming it, "
    "and copies an honest one's",
    "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path()), faulty("faulty", root.path());
    const Environment honest{{"STARLING_SWARM_EVAL_EVERY", "2"}};
    Environment typo = honest;
    typo["STARLING_OPTIMIZER_LR"] = "1e2";
    a.start({}, honest);
    b.start({a.peer_address()}, honest);
    faulty.start({a.peer_address()}, typo);
    // After two rounds at a learning rate of 1e2 the faulty member's phi is orders of magnitude
    // from the others' (or NaN); the joiner learns every member from a's view when it joins.
    eventually("the faulty member reaches round 2", 120s,
               [&] { return status_u64(faulty, "round") >= 2; });
    eventually("a sees both members", 60s, [&] { return status_u64(a, "peers_alive") == 2; });

    TestDaemon joiner("joiner", root.path());
    joiner.start({a.peer_address()}, honest);
    eventually("the joiner copies a state or gives up", 120s, [&] {
        const std::string log = joiner.log();
        return log.find("joined at round") != std::string::npos ||
               log.find("copying the state failed") != std::string::npos;
    });
    const std::string copied = joiner.log();
    INFO(copied);
    REQUIRE(copied.find("joined at round") != std::string::npos);
    const auto refusals = lines_with(copied, {"warn", faulty.peer_address(), "refused"});
    REQUIRE(refusals.size() == 1);
    CHECK_THAT(refusals.front(), Catch::Contains("phi's norm"));
    CHECK(lines_with(copied, {"refused", a.peer_address()}).empty());
    CHECK(lines_with(copied, {"refused", b.peer_address()}).empty());

    // What it copied trains on: finite losses, and a finite validation loss of phi.
    eventually("the joiner trains 4 rounds and evaluates phi", 180s, [&] {
        const std::string log = joiner.log();
        if (trained_to_nan(log)) FAIL("the joiner trained to NaN\n" << daemon_log_tails());
        return logged_rounds(log).size() >= 4 && status_has(joiner, "val_loss");
    });
    const nlohmann::json status = joiner.status();
    INFO("the joiner's validation loss: " << status["val_loss"]);
    CHECK(std::isfinite(status["val_loss"].get<double>()));
    CHECK(status["val_loss"].get<double>() < 5.0);  // ln 256 = 5.55 untrained
    for (TestDaemon* d : {&a, &b, &faulty, &joiner}) d->process().signal(SIGTERM);
    for (TestDaemon* d : {&a, &b, &faulty, &joiner}) d->process().wait(20s);
}

TEST_CASE("a NoLoCo member whose weight decay is mistyped 30 is refused, quarantined and named",
          "[integration]") {
    // Its weights shrink: the update's norm is ordinary and, after the first rounds, it no longer
    // points clearly away, but its weights score worse on the held-out batch.
    const FaultyRun run =
        run_with_faulty_member("noloco", {{"STARLING_OPTIMIZER_WEIGHT_DECAY", "30"}});
    check_named_and_quarantined(run);
}

TEST_CASE(
    "a member whose data is random bytes is refused, quarantined and named, NoLoCo and DiLoCo",
    "[integration]") {
    TempDir shards_root;
    const std::string shards = random_byte_shards(shards_root.path());
    for (const std::string method : {"noloco", "diloco"}) {
        INFO(method);
        const FaultyRun run = run_with_faulty_member(method, {{"STARLING_DATA_DIR", shards}});
        check_named_and_quarantined(run);
    }
}

TEST_CASE("a member whose messages are sign-flipped is refused, quarantined and named",
          "[integration]") {
    const std::string method = GENERATE(as<std::string>{}, "noloco", "diloco");
    INFO(method);
    // Its own training is honest: only what it sends is flipped (faulty_starlingd), so neither
    // sane() nor a norm bound can tell; NoLoCo's held-out check and its alignment test at the
    // update sample (while honest partners align), and DiLoCo's direction test, do.
    const FaultyRun run =
        run_with_faulty_member(method, {}, {faulty_starlingd_binary(), "--fault", "sign_flip"});
    check_named_and_quarantined(run);
    // In NoLoCo the alignment test refused it, or the held-out check where the round lines say
    // by how much (the alignment test judges first: a flipped update scores far below 0).
    if (method == "noloco")
        CHECK(check_logged_held_out_scores(run.logs) +
                  lines_with(run.logs, {"at its update sample's", "no more aligned"}).size() >=
              1);
}

TEST_CASE("a NoLoCo member whose update is noise of its norm is refused as unaligned",
          "[integration]") {
    // Its weights (phi + noise) score near an honest partner's on the held-out batch in most
    // rounds, and its distance is an update's: only the alignment of its update with each node's
    // own tells it (optimizer/sanity.h, unaligned_update): a split D whole, a fused theta - phi
    // where the message's update sample says it.
    const std::string mode = GENERATE(as<std::string>{}, "split", "fused");
    INFO(mode);
    const FaultyRun run = run_with_faulty_member(
        "noloco", {}, {faulty_starlingd_binary(), "--fault", "noise"}, kRounds, true,
        {{"STARLING_EXCHANGE_MODE", mode}, {"STARLING_EXCHANGE_UPDATE_SAMPLE", "8192"}});
    check_named_and_quarantined(run);
    CHECK(!lines_with(run.logs, {"no more aligned"}).empty());
}

TEST_CASE("a DiLoCo member that sends its D of the round before is left out as a round old",
          "[integration]") {
    // Its D is honest but a round old: its norm and direction pass, and only the staleness test
    // tells it (it points the last outer step's way more than the others' D's do). Not
    // necessarily quarantined: in 2 runs of 11 it was left out every other round only (rounds 15,
    // 17, 19 and 21 of one), which three refusals in five alternating messages now quarantine
    // (peer/member_scores.h), but in 1 of 4 later runs it was left out in rounds 6, 14, 16 and
    // 22 of 40 only, and taken in the others (docs/security.md).
    const FaultyRun run =
        run_with_faulty_member("diloco", {}, {faulty_starlingd_binary(), "--fault", "replay"});
    INFO(run.logs);
    CHECK(lines_with(run.logs, {"left out as a round old"}).size() >= 2);
    REQUIRE(run.views_of_faulty.size() == 3);
    CHECK(run.honest_refused <= 8);
}

// The damage the faulty member still does, against a control swarm of the three honest nodes
// alone (what the honest nodes would have trained without it; a fourth honest node would train a
// third more tokens): the mean of the honest nodes' validation losses over rounds 121-240.
// Measured (4 runs each, 2-core VM): NoLoCo beside a learning rate of 1e2 1.707-1.734 against
// controls of 1.705-1.736 (+0.5% on the means), DiLoCo beside 1e3 1.673-1.697 against
// 1.661-1.674 (+1.2%); again with quarantine by strikes, NoLoCo 1.710-1.734 against
// 1.713-1.735 (+0.1%), DiLoCo 1.666-1.693 against 1.663-1.683 (+0.4%); before the defences every
// honest node ended NaN. A control run of pico daemons varies by up to 2% from the next, and one
// faulty run from its control by -0.9% to +1.5%, so the bound is 5%, not the 1% the study holds
// the simulation to (docs/security.md).
TEST_CASE(
    "honest nodes beside a member with a mistyped learning rate end within 5% of a control swarm",
    "[integration]") {
    const std::string method = GENERATE(as<std::string>{}, "noloco", "diloco");
    INFO(method);
    constexpr uint64_t kLossRounds = 240;
    const FaultyRun faulty = run_with_faulty_member(
        method, {{"STARLING_OPTIMIZER_LR", method == "noloco" ? "1e2" : "1e3"}}, {}, kLossRounds);
    const FaultyRun control = run_with_faulty_member(method, {}, {}, kLossRounds, false);
    INFO("honest nodes beside the faulty one: " << faulty.honest_val_loss
                                                << ", control: " << control.honest_val_loss);
    CHECK(faulty.honest_val_loss < 1.05 * control.honest_val_loss);
}
