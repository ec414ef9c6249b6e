#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <random>

#include "peer/membership.h"

using namespace starling;
using namespace std::chrono_literals;

namespace {

const SteadyClock::time_point t0{};

Member member(uint64_t id, uint64_t incarnation, MemberState state, uint64_t instance = 1) {
    Member m;
    m.node_id = id;
    m.address = "127.0.0.1:" + std::to_string(7000 + id);
    m.incarnation = incarnation;
    m.state = state;
    m.fingerprint = "f";
    m.swarm_id = "s";
    m.instance = instance;
    return m;
}

MemberTable table_with_limits(MembershipLimits limits = {1000ms, 5000ms, 16}) {
    return MemberTable(member(100, 50, MemberState::Alive, 42), limits);
}

MemberState state_of(const MemberTable& table, uint64_t id) { return table.find(id).value().state; }

}  // namespace

TEST_CASE("the higher incarnation wins, and at one incarnation LEFT > DEAD > SUSPECT > ALIVE") {
    MemberTable table = table_with_limits();
    REQUIRE(table.merge(member(1, 5, MemberState::Alive), t0) == MemberTable::Merge::Added);
    REQUIRE(table.merge(member(1, 5, MemberState::Suspect), t0) == MemberTable::Merge::Updated);
    REQUIRE(state_of(table, 1) == MemberState::Suspect);
    // An ALIVE at the same incarnation cannot clear a suspicion; the member must refute.
    REQUIRE(table.merge(member(1, 5, MemberState::Alive), t0) == MemberTable::Merge::Ignored);
    REQUIRE(state_of(table, 1) == MemberState::Suspect);
    REQUIRE(table.merge(member(1, 6, MemberState::Alive), t0) == MemberTable::Merge::Updated);
    REQUIRE(state_of(table, 1) == MemberState::Alive);
    REQUIRE(table.merge(member(1, 6, MemberState::Dead), t0) == MemberTable::Merge::Updated);
    REQUIRE(table.merge(member(1, 6, MemberState::Suspect), t0) == MemberTable::Merge::Ignored);
    REQUIRE(table.merge(member(1, 6, MemberState::Left), t0) == MemberTable::Merge::Updated);
    REQUIRE(table.merge(member(1, 6, MemberState::Dead), t0) == MemberTable::Merge::Ignored);
    REQUIRE(state_of(table, 1) == MemberState::Left);
    // A restart carries a later incarnation and supersedes the departure.
    REQUIRE(table.merge(member(1, 9, MemberState::Alive, 2), t0) == MemberTable::Merge::Updated);
    REQUIRE(state_of(table, 1) == MemberState::Alive);
    REQUIRE(table.find(1)->instance == 2);
}

TEST_CASE("the round of a member only moves forward at one incarnation") {
    MemberTable table = table_with_limits();
    Member m = member(1, 5, MemberState::Alive);
    m.round = 10;
    table.merge(m, t0);
    m.round = 7;
    table.merge(m, t0);
    REQUIRE(table.find(1)->round == 10);
    m.round = 12;
    table.merge(m, t0);
    REQUIRE(table.find(1)->round == 12);
    // alive_round: the same round, without the copy, and none once the member is not ALIVE.
    CHECK(table.alive_round(1) == 12u);
    CHECK(table.alive_round(2) == std::nullopt);
    CHECK(table.alive_round(100) == table.self().round);
    m.state = MemberState::Suspect;
    table.merge(m, t0);
    CHECK(table.alive_round(1) == std::nullopt);
}

TEST_CASE("a member's last choice of partner: both rounds only move forward") {
    MemberTable table = table_with_limits();
    Member m = member(1, 5, MemberState::Alive);
    m.round = 10;
    m.paired_through = 9;
    m.solo_through = 10;
    table.merge(m, t0);
    CHECK(solo_last(*table.find(1)));
    m.paired_through = 4;  // an older digest arriving late
    m.solo_through = 3;
    table.merge(m, t0);
    CHECK(table.find(1)->paired_through == 9);
    CHECK(table.find(1)->solo_through == 10);
    m.paired_through = 11;
    table.merge(m, t0);
    CHECK(!solo_last(*table.find(1)));

    // A fresh node has made no choice: not solo.
    CHECK(!solo_last(table.self()));
    table.set_choice(41, false);
    CHECK(table.self().solo_through == 42);
    CHECK(solo_last(table.self()));
    table.set_choice(42, true);
    CHECK(table.self().paired_through == 43);
    CHECK(!solo_last(table.self()));
    table.set_choice(40, false);  // never back
    CHECK(table.self().solo_through == 42);
}

TEST_CASE("a member's step time follows its newest round, and the pairable members' are listed") {
    MemberTable table = table_with_limits();
    Member m = member(1, 5, MemberState::Alive);
    m.round = 10;
    m.step_seconds = 0.5;
    table.merge(m, t0);
    m.round = 9;  // an older digest arriving late
    m.step_seconds = 0.9;
    table.merge(m, t0);
    CHECK(table.find(1)->step_seconds == 0.5);
    m.round = 11;
    m.step_seconds = 0.25;
    table.merge(m, t0);
    CHECK(table.find(1)->step_seconds == 0.25);
    m.round = 12;  // a digest from before its first phase ended says none
    m.step_seconds = 0.0;
    table.merge(m, t0);
    CHECK(table.find(1)->step_seconds == 0.25);

    Member other_model = member(2, 5, MemberState::Alive);
    other_model.fingerprint = "g";
    other_model.step_seconds = 3.0;
    Member suspect = member(3, 5, MemberState::Alive);
    suspect.step_seconds = 4.0;
    table.merge(other_model, t0);
    table.merge(suspect, t0);
    table.suspect(3, t0);
    table.merge(member(4, 5, MemberState::Alive), t0);  // no step time yet
    CHECK(table.pairable_step_seconds() == std::vector<double>{0.25});
    table.set_step_seconds(0.125);
    CHECK(table.self().step_seconds == 0.125);
    auto listed = table.pairable_step_seconds();
    std::sort(listed.begin(), listed.end());
    CHECK(listed == std::vector<double>{0.125, 0.25});
}

TEST_CASE("unknown members reported dead or left are not added") {
    MemberTable table = table_with_limits();
    REQUIRE(table.merge(member(1, 5, MemberState::Dead), t0) == MemberTable::Merge::Ignored);
    REQUIRE(table.merge(member(2, 5, MemberState::Left), t0) == MemberTable::Merge::Ignored);
    REQUIRE(table.all().size() == 1);
}

TEST_CASE("a node refutes a suspicion of itself by raising its incarnation") {
    MemberTable table = table_with_limits();
    REQUIRE(table.merge(member(100, 50, MemberState::Suspect, 42), t0) ==
            MemberTable::Merge::Refuted);
    REQUIRE(table.self().incarnation == 51);
    REQUIRE(table.self().state == MemberState::Alive);
    // Old news about an earlier incarnation needs no answer.
    REQUIRE(table.merge(member(100, 50, MemberState::Dead, 42), t0) == MemberTable::Merge::Ignored);
    REQUIRE(table.merge(member(100, 51, MemberState::Dead, 42), t0) == MemberTable::Merge::Refuted);
    REQUIRE(table.self().incarnation == 52);
    // A leaving node does not argue with reports of its departure.
    table.leave();
    REQUIRE(table.merge(member(100, 52, MemberState::Dead, 42), t0) == MemberTable::Merge::Ignored);
    REQUIRE(table.self().state == MemberState::Left);
}

TEST_CASE(
    "a live digest with this node's id from another instance is a duplicate, and old runs are not") {
    MemberTable table = table_with_limits();
    REQUIRE(table.merge(member(100, 60, MemberState::Alive, 7), t0) ==
            MemberTable::Merge::Duplicate);
    REQUIRE(table.merge(member(100, 40, MemberState::Alive, 7), t0) == MemberTable::Merge::Ignored);
    REQUIRE(table.merge(member(100, 60, MemberState::Dead, 7), t0) == MemberTable::Merge::Ignored);
    REQUIRE(table.self().incarnation == 50);
}

TEST_CASE(
    "suspicion turns into death after the timeout: the dead are listed, then purged for good") {
    MemberTable table = table_with_limits();
    table.merge(member(1, 5, MemberState::Alive), t0);
    table.merge(member(2, 5, MemberState::Alive), t0);
    table.suspect(1, t0);
    REQUIRE(state_of(table, 1) == MemberState::Suspect);
    REQUIRE(table.expire(t0 + 999ms).empty());
    REQUIRE(table.expire(t0 + 1000ms) == std::vector<uint64_t>{1});
    REQUIRE(state_of(table, 1) == MemberState::Dead);
    REQUIRE(state_of(table, 2) == MemberState::Alive);
    table.expire(t0 + 1000ms + 4999ms);
    REQUIRE(table.find(1).has_value());
    table.expire(t0 + 1000ms + 5000ms);
    REQUIRE_FALSE(table.find(1).has_value());
    // A straggler's stale ALIVE cannot bring it back: it is listed dead again, which the next
    // gossip passes on. A restart (later incarnation) can.
    REQUIRE(table.merge(member(1, 5, MemberState::Alive), t0 + 7s) == MemberTable::Merge::Updated);
    REQUIRE(state_of(table, 1) == MemberState::Dead);
    REQUIRE(table.pairable_ids() == std::vector<uint64_t>{2, 100});
    REQUIRE(table.merge(member(1, 6, MemberState::Alive), t0 + 7s) == MemberTable::Merge::Updated);
    REQUIRE(state_of(table, 1) == MemberState::Alive);
}

TEST_CASE("tombstones last ten retentions, and past max_members the oldest go first") {
    // Suspicion 1 s, retention 5 s, at most 4 members (3 others) and 4 tombstones. A tombstone
    // shows when a stale ALIVE at the incarnation the member went at arrives: held, the member is
    // listed dead again; gone, it is added as new.
    const auto bury = [](MemberTable& table, uint64_t id, SteadyClock::time_point at) {
        table.merge(member(id, 5, MemberState::Alive), at);
        table.merge(member(id, 5, MemberState::Left), at);
        table.expire(at + 5000ms);  // purged, buried at at + 5 s
        REQUIRE_FALSE(table.find(id).has_value());
    };
    const auto stale_alive = [](MemberTable& table, uint64_t id, SteadyClock::time_point at) {
        return table.merge(member(id, 5, MemberState::Alive), at);
    };
    MemberTable table = table_with_limits({1000ms, 5000ms, 4});
    for (const uint64_t id : {1, 2, 3}) bury(table, id, t0);
    table.expire(t0 + 5s + 49s);
    CHECK(stale_alive(table, 1, t0 + 5s + 49s) == MemberTable::Merge::Updated);
    CHECK(state_of(table, 1) == MemberState::Dead);
    table.expire(t0 + 5s + 50s);
    CHECK(stale_alive(table, 2, t0 + 5s + 50s) == MemberTable::Merge::Added);
    CHECK(state_of(table, 2) == MemberState::Alive);

    MemberTable capped = table_with_limits({1000ms, 5000ms, 4});
    for (uint64_t id = 10; id < 15; ++id) bury(capped, id, t0 + std::chrono::seconds(id));
    CHECK(stale_alive(capped, 10, t0 + 20s) == MemberTable::Merge::Added);
    CHECK(stale_alive(capped, 11, t0 + 20s) == MemberTable::Merge::Updated);
}

TEST_CASE("a suspicion learned from gossip is timed from when this node learned it") {
    MemberTable table = table_with_limits();
    table.merge(member(1, 5, MemberState::Alive), t0);
    table.merge(member(1, 5, MemberState::Suspect), t0 + 3s);
    REQUIRE(table.expire(t0 + 3s + 999ms).empty());
    REQUIRE(table.expire(t0 + 4s) == std::vector<uint64_t>{1});
}

TEST_CASE("the table holds at most max_members entries") {
    MemberTable table = table_with_limits({1000ms, 5000ms, 4});
    for (uint64_t id = 1; id <= 10; ++id) table.merge(member(id, 1, MemberState::Alive), t0);
    REQUIRE(table.all().size() == 4);
}

TEST_CASE("only alive, compatible members are pairable") {
    MemberTable table = table_with_limits();
    table.merge(member(1, 5, MemberState::Alive), t0);
    table.merge(member(2, 5, MemberState::Alive), t0);
    table.merge(member(3, 5, MemberState::Alive), t0);
    Member other_model = member(4, 5, MemberState::Alive);
    other_model.fingerprint = "g";
    Member other_swarm = member(5, 5, MemberState::Alive);
    other_swarm.swarm_id = "t";
    Member other_protocol = member(6, 5, MemberState::Alive);
    other_protocol.protocol_version = kProtocolVersion + 1;
    for (const Member& m : {other_model, other_swarm, other_protocol}) table.merge(m, t0);
    table.suspect(2, t0);
    table.merge(member(3, 5, MemberState::Left), t0);
    REQUIRE(table.pairable_ids() == std::vector<uint64_t>{1, 100});
    REQUIRE(table.all().size() == 7);  // the incompatible ones are still listed
    REQUIRE(table.reachable_others().size() == 5);
}

TEST_CASE("the sorted pairable view kept between reads matches one built from the whole table") {
    // The view is merged from the members that changed since the last read, or rebuilt past a
    // sixteenth of the table; a second computation from all() checks it after random changes.
    MemberTable table = table_with_limits({1000ms, 5000ms, 4096});
    std::mt19937_64 rng(7);
    const auto from_scratch = [&] {
        std::vector<uint64_t> ids;
        for (const Member& m : table.all())
            if (m.state == MemberState::Alive && table.compatible(m)) ids.push_back(m.node_id);
        std::sort(ids.begin(), ids.end());
        return ids;
    };
    auto now = t0;
    std::map<uint64_t, uint64_t> incarnations;
    size_t reads = 0;
    for (int step = 0; step < 4000; ++step) {
        const uint64_t id = 1 + rng() % 300;
        const uint64_t incarnation = incarnations[id] += rng() % 3;
        switch (rng() % 6) {
            case 0:
            case 1: table.merge(member(id, incarnation, MemberState::Alive), now); break;
            case 2: table.suspect(id, now); break;
            case 3: {
                Member m = member(id, incarnation + 1, MemberState::Alive);
                m.fingerprint = "g";  // another model: listed, never pairable
                table.merge(m, now);
                break;
            }
            case 4: table.merge(member(id, incarnation, MemberState::Left), now); break;
            default: now += 700ms; table.expire(now);  // suspects die, the gone are purged
        }
        // Reads after one change, after a few and after many, so both paths run.
        if (rng() % (step < 2000 ? 2 : 150) == 0) {
            ++reads;
            REQUIRE(table.pairable_ids() == from_scratch());
        }
    }
    CHECK(reads > 1000);
    CHECK(table.pairable_ids() == from_scratch());
}

TEST_CASE("what pairing reads of the pairable members matches the members themselves") {
    MemberTable table = table_with_limits();
    Member open = member(1, 5, MemberState::Alive);
    open.round = 9;
    open.paired_through = 8;
    open.solo_through = 9;
    Member anchored = member(2, 5, MemberState::Alive);
    anchored.reachability = Reachability::Private;
    anchored.anchors = {1};
    anchored.round = 10;
    Member unreachable = member(3, 5, MemberState::Alive);
    unreachable.reachability = Reachability::Private;
    Member other_model = member(4, 5, MemberState::Alive);
    other_model.fingerprint = "g";
    for (const Member& m : {open, anchored, unreachable, other_model}) table.merge(m, t0);
    table.merge(member(5, 5, MemberState::Alive), t0);
    table.suspect(5, t0);
    auto facts = table.pairable_facts();
    std::sort(facts.begin(), facts.end(),
              [](const PairingFacts& a, const PairingFacts& b) { return a.node_id < b.node_id; });
    // Only the three alive, compatible others; their facts as pairing_facts reads the members.
    CHECK(facts ==
          pairing_facts(std::vector<Member>{*table.find(1), *table.find(2), *table.find(3)}));
    // By hand: the rounds as merged; callable unless private; proposable when callable or
    // anchored.
    CHECK(facts[0] == PairingFacts{1, 9, 8, 9, true, true});
    CHECK(facts[1] == PairingFacts{2, 10, 0, 0, false, true});
    CHECK(facts[2] == PairingFacts{3, 0, 0, 0, false, false});
    CHECK(solo_last(facts[0]));
    CHECK_FALSE(solo_last(facts[1]));
}

TEST_CASE("a member is heard from when its own word arrives, not when others pass on its digest") {
    MemberTable table = table_with_limits();
    Member m = member(1, 5, MemberState::Alive);
    m.round = 3;
    table.merge(m, t0);
    CHECK(table.find(1)->heard == SteadyClock::time_point{});  // passed on by another
    table.heard_from(1, t0 + 2s);
    table.heard_from(99, t0 + 2s);  // unknown: ignored
    CHECK(table.find(1)->heard == t0 + 2s);
    // A newer incarnation passed on by another replaces the entry but not when it was heard.
    m.incarnation = 6;
    m.round = 4;
    CHECK(table.merge(m, t0 + 3s) == MemberTable::Merge::Updated);
    CHECK(table.find(1)->heard == t0 + 2s);
    CHECK(table.pairable_facts().front().heard == t0 + 2s);
    // Its pair traffic: the round it chooses for, as of now.
    table.note_round(1, 7, t0 + 5s);
    CHECK(table.find(1)->round == 7u);
    CHECK(table.find(1)->heard == t0 + 5s);
    table.note_round(1, 6, t0 + 6s);  // rounds only go up
    CHECK(table.find(1)->round == 7u);
}

TEST_CASE("members that say another method are not pairable; one that says none is") {
    Member self = member(100, 50, MemberState::Alive, 42);
    self.method = "noloco fused";
    MemberTable table(self, {1000ms, 5000ms, 16});
    Member same = member(1, 5, MemberState::Alive);
    same.method = "noloco fused";
    Member split = member(2, 5, MemberState::Alive);
    split.method = "noloco split";
    Member diloco = member(3, 5, MemberState::Alive);
    diloco.method = "diloco";
    const Member unsaid = member(4, 5, MemberState::Alive);  // a node that does not say it
    for (const Member& m : {same, split, diloco, unsaid}) table.merge(m, t0);
    CHECK(table.pairable_ids() == std::vector<uint64_t>{1, 4, 100});
    CHECK(incompatibility(split, self) == "runs method 'noloco split' (this node: 'noloco fused')");
    CHECK(incompatibility(diloco, self) == "runs method 'diloco' (this node: 'noloco fused')");
    CHECK(incompatibility(same, self).empty());
    CHECK(incompatibility(unsaid, self).empty());
}
