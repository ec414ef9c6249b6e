#include <catch2/catch.hpp>

#include <algorithm>
#include <memory>
#include <set>

#include "peer/seed_retries.h"
#include "peer/swim.h"

using namespace starling;
using namespace std::chrono_literals;

namespace {

const SteadyClock::time_point t0{};

Member member(uint64_t id, uint64_t incarnation = 5, MemberState state = MemberState::Alive) {
    Member m;
    m.node_id = id;
    m.address = "10.0.0." + std::to_string(id) + ":7700";
    m.incarnation = incarnation;
    m.state = state;
    m.fingerprint = "f";
    m.swarm_id = "s";
    m.instance = 1;
    m.reachability = Reachability::Public;
    return m;
}

// A core for node 100 that lists members 1..others alive, without any news to pass on.
std::unique_ptr<SwimCore> core_with(size_t others, SwimSettings settings = {}, uint64_t seed = 7) {
    auto core = std::make_unique<SwimCore>(member(100), MembershipLimits{1000ms, 5000ms, 4096},
                                           settings, seed);
    for (uint64_t id = 1; id <= others; id++) core->table().merge(member(id), t0);
    return core;
}

std::vector<uint64_t> ids_of(const std::vector<Member>& members) {
    std::vector<uint64_t> ids;
    for (const Member& m : members) ids.push_back(m.node_id);
    return ids;
}

// The members that nine periods at `now` choose to probe.
std::set<uint64_t> probed_within(SwimCore& core, SteadyClock::time_point now) {
    std::set<uint64_t> probed;
    for (int period = 0; period < 3 * 3; period++)
        if (const auto p = core.tick(now); p.probe) probed.insert(p.probe->node_id);
    return probed;
}

}  // namespace

TEST_CASE("swim: each period probes the next member of a round robin, which covers all of them") {
    auto core = core_with(9);
    std::multiset<uint64_t> probed;
    for (int period = 0; period < 9 * 3; period++) {
        const SwimCore::Period p = core->tick(t0);
        REQUIRE(p.probe);
        REQUIRE(p.gossip);
        REQUIRE(p.gossip->node_id != 100);
        probed.insert(p.probe->node_id);
    }
    // Three whole round robins: every member exactly three times, this node never.
    for (uint64_t id = 1; id <= 9; id++) REQUIRE(probed.count(id) == 3);
    REQUIRE(probed.size() == 27);
}

TEST_CASE(
    "swim: a member whose reachability is unknown is probed only once it has been alive for "
    "the grace") {
    SwimSettings settings;
    settings.unknown_grace = 10s;
    auto core = core_with(2, settings);
    Member joiner = member(3);
    joiner.reachability = Reachability::Unknown;
    core->table().merge(joiner, t0);
    CHECK(probed_within(*core, t0 + 9999ms) == std::set<uint64_t>{1, 2});
    CHECK(probed_within(*core, t0 + 10s) == std::set<uint64_t>{1, 2, 3});
    // Its verdict, private with an anchor, ends the grace: it is probed through the anchor.
    joiner.reachability = Reachability::Private;
    joiner.anchors = {1};
    joiner.incarnation++;
    core->table().merge(joiner, t0 + 1s);
    CHECK(probed_within(*core, t0 + 1s) == std::set<uint64_t>{1, 2, 3});
    // A suspected member is probed whatever its reachability: its answer refutes.
    Member suspect = member(4, 5, MemberState::Suspect);
    suspect.reachability = Reachability::Unknown;
    core->table().merge(suspect, t0 + 2s);
    CHECK(probed_within(*core, t0 + 2s).contains(4));
}

TEST_CASE("swim: a private member that names no anchors here is probed only after the grace") {
    SwimSettings settings;
    settings.anchorless_grace = 60s;
    auto core = core_with(2, settings);
    // Private, said a moment before it names its anchors: nobody this node could ask reaches it.
    Member fresh = member(3, 6);
    fresh.reachability = Reachability::Private;
    core->table().merge(fresh, t0);
    CHECK(probed_within(*core, t0 + 59s) == std::set<uint64_t>{1, 2});
    // One that still names none a minute on (it died before it could) is probed as any other.
    CHECK(probed_within(*core, t0 + 60s) == std::set<uint64_t>{1, 2, 3});
    // Its anchors named (a later incarnation, learnt now) end the wait at once.
    fresh.anchors = {1};
    fresh.incarnation++;
    core->table().merge(fresh, t0 + 61s);
    CHECK(probed_within(*core, t0 + 61s) == std::set<uint64_t>{1, 2, 3});
    // A suspected one is probed at once: the probe's answer, if one comes, refutes.
    Member suspect = member(4, 5, MemberState::Suspect);
    suspect.reachability = Reachability::Private;
    core->table().merge(suspect, t0 + 62s);
    CHECK(probed_within(*core, t0 + 62s).contains(4));
}

TEST_CASE("swim: a failed probe makes an alive member suspect, and the timeout makes it dead") {
    auto core = core_with(3);
    REQUIRE(core->probe_failed(2, t0));
    REQUIRE(core->table().find(2)->state == MemberState::Suspect);
    REQUIRE_FALSE(core->probe_failed(2, t0 + 100ms));  // already suspect: nothing new
    REQUIRE(core->tick(t0 + 999ms).declared_dead.empty());
    REQUIRE(core->tick(t0 + 1000ms).declared_dead == std::vector<uint64_t>{2});
    REQUIRE(core->table().find(2)->state == MemberState::Dead);
    // Dead members are neither probed nor gossiped with.
    for (int period = 0; period < 10; period++) {
        const SwimCore::Period p = core->tick(t0 + 2s);
        REQUIRE(p.probe->node_id != 2);
        REQUIRE(p.gossip->node_id != 2);
    }
}

TEST_CASE("swim: a member's probe timeout follows the round trips of its acks, RFC 6298's way") {
    auto core = core_with(3);
    const auto base = 500ms;
    REQUIRE(core->probe_timeout_for(1, base) == base);  // never answered: the configured one
    // Near and quick: 100 ms, variation 50: 300 ms, below the floor.
    core->acked(1, 100ms);
    REQUIRE(core->probe_timeout_for(1, base) == base);
    // A slow member: first 600 ms (variation 300): 600 + 4 x 300 = 1800 ms.
    core->acked(2, 600ms);
    REQUIRE(core->probe_timeout_for(2, base) == 1800ms);
    // Again 600: variation 3/4 x 300 = 225, mean 600: 1500 ms.
    core->acked(2, 600ms);
    REQUIRE(core->probe_timeout_for(2, base) == 1500ms);
    // Then 1000: variation 3/4 x 225 + 1/4 x 400 = 268.75, mean 7/8 x 600 + 1/8 x 1000 = 650:
    // 650 + 1075 = 1725 ms.
    core->acked(2, 1000ms);
    REQUIRE(core->probe_timeout_for(2, base) == 1725ms);
    // Never past the ceiling, however slow.
    core->acked(3, 5s);
    REQUIRE(core->probe_timeout_for(3, base) == SwimCore::kProbeTimeoutCeiling * base);
    // A member declared dead starts over: its restart may come over another path. (The failed
    // probe counts against this node's local health: base x 2.)
    REQUIRE(core->probe_failed(2, t0));
    REQUIRE(core->tick(t0 + 1000ms).declared_dead == std::vector<uint64_t>{2});
    REQUIRE(!core->round_trip_ms(2));
    REQUIRE(core->probe_timeout_for(2, base) == 2 * base);
}

TEST_CASE(
    "swim: failed probes and refuted suspicions stretch a node's own probe timeouts, "
    "answered probes bring them back (Lifeguard's local health)") {
    auto core = core_with(12);
    const auto base = 500ms;
    core->acked(1, 600ms);  // 1800 ms, as in the test above
    REQUIRE(core->local_health() == 0);
    // Three members miss their probes: each timeout is (1 + 3) times what it was.
    for (uint64_t id = 2; id <= 4; id++) REQUIRE(core->probe_failed(id, t0));
    REQUIRE(core->local_health() == 3);
    REQUIRE(core->probe_timeout_for(5, base) == 4 * base);
    REQUIRE(core->probe_timeout_for(1, base) == 4 * 1800ms);
    // Another node suspects this one, which refutes it: once more.
    const Member rumour = member(100, 5, MemberState::Suspect);
    REQUIRE(core->merge(rumour, t0) == MemberTable::Merge::Refuted);
    REQUIRE(core->local_health() == 4);
    // A probe that fails again, of a member already suspect, counts too: it is this node's
    // deadline that passed.
    REQUIRE_FALSE(core->probe_failed(2, t0));
    REQUIRE(core->local_health() == 5);
    // Never past the cap...
    for (uint64_t id = 5; id <= 12; id++) core->probe_failed(id, t0);
    REQUIRE(core->local_health() == SwimCore::kMaxLocalHealth);
    REQUIRE(core->probe_timeout_for(1, base) == (1 + SwimCore::kMaxLocalHealth) * 1800ms);
    // ...and each answered probe counts one back, down to nothing.
    for (int i = 0; i < SwimCore::kMaxLocalHealth - 1; i++) core->acked(1, 600ms);
    REQUIRE(core->local_health() == 1);
    core->acked(1, 600ms);
    core->acked(1, 600ms);
    REQUIRE(core->local_health() == 0);
    REQUIRE(core->probe_timeout_for(99, base) == base);
}

TEST_CASE("swim: indirect helpers are k other reachable members, never the target") {
    SwimSettings settings;
    settings.indirect_probes = 3;
    auto core = core_with(40, settings);
    core->table().merge(member(7, 5, MemberState::Dead), t0);
    for (int draw = 0; draw < 50; draw++) {
        const auto helpers = ids_of(core->indirect_helpers(3));
        REQUIRE(helpers.size() == 3);
        REQUIRE(std::set<uint64_t>(helpers.begin(), helpers.end()).size() == 3);
        for (const uint64_t id : helpers) {
            REQUIRE(id != 3);
            REQUIRE(id != 7);
            REQUIRE(id != 100);
        }
    }
    // Fewer reachable members than k: all of them.
    auto small = core_with(3, settings);
    auto helpers = ids_of(small->indirect_helpers(1));
    std::sort(helpers.begin(), helpers.end());
    REQUIRE(helpers == std::vector<uint64_t>{2, 3});
}

TEST_CASE("swim: a small view gossips whole") {
    auto core = core_with(10);
    auto sent = ids_of(core->gossip_payload());
    REQUIRE(sent.front() == 100);
    std::sort(sent.begin(), sent.end());
    std::vector<uint64_t> all{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 100};
    REQUIRE(sent == all);
}

TEST_CASE("swim: past full_view_max a message holds digests_max digests, news first") {
    SwimSettings settings;
    settings.full_view_max = 8;
    settings.digests_max = 3;
    settings.retransmit_factor = 1;
    // 21 members: each change goes out 1 * ceil(log2(22)) = 5 times.
    auto core = core_with(20, settings);
    REQUIRE(core->merge(member(4, 6), t0) == MemberTable::Merge::Updated);
    for (int message = 0; message < 2; message++) {
        const auto sent = ids_of(core->gossip_payload());
        REQUIRE(sent.size() == 3);
        REQUIRE(sent[0] == 100);
        REQUIRE(sent[1] == 4);
        REQUIRE(sent[2] != 4);
    }
    // Fresher news (5 sends left) goes before member 4's (3 left), then 4's last three sends.
    REQUIRE(core->merge(member(9, 5, MemberState::Suspect), t0) == MemberTable::Merge::Updated);
    for (int message = 0; message < 5; message++) {
        const auto sent = ids_of(core->gossip_payload());
        REQUIRE(sent.size() == 3);
        REQUIRE(sent[1] == 9);
        if (message < 3) REQUIRE(sent[2] == 4);
    }
    // Merges that change nothing are no news: with none left, the rest of a message is drawn at
    // random, without repeats and without this node twice.
    REQUIRE(core->merge(member(12), t0) == MemberTable::Merge::Ignored);
    std::set<uint64_t> drawn;
    for (int message = 0; message < 200; message++) {
        const auto sent = ids_of(core->gossip_payload());
        REQUIRE(sent.size() == 3);
        REQUIRE(sent[0] == 100);
        REQUIRE(sent[1] != sent[2]);
        REQUIRE(sent[1] != 100);
        REQUIRE(sent[2] != 100);
        drawn.insert(sent.begin() + 1, sent.end());
    }
    REQUIRE(drawn.size() == 20);
}

TEST_CASE("swim: news with as many sends left goes lower id first, and renewed news starts over") {
    SwimSettings settings;
    settings.full_view_max = 8;
    settings.digests_max = 3;
    settings.retransmit_factor = 1;
    auto core = core_with(20, settings);  // 21 members: 5 sends each
    REQUIRE(core->merge(member(9, 6), t0) == MemberTable::Merge::Updated);
    REQUIRE(core->merge(member(4, 6), t0) == MemberTable::Merge::Updated);
    auto sent = ids_of(core->gossip_payload());
    REQUIRE(sent == std::vector<uint64_t>{100, 4, 9});
    // Member 4 changes again: its news has 5 sends left once more, 9's has 4.
    REQUIRE(core->merge(member(4, 7), t0) == MemberTable::Merge::Updated);
    for (int message = 0; message < 4; message++) {
        sent = ids_of(core->gossip_payload());
        REQUIRE(sent == std::vector<uint64_t>{100, 4, 9});
    }
    // 9 has gone out 5 times; 4 once more, beside a member drawn at random; then no news.
    sent = ids_of(core->gossip_payload());
    REQUIRE(sent.size() == 3);
    REQUIRE(sent[1] == 4);
    REQUIRE(sent[2] != 4);
    for (int message = 0; message < 20; message++) {
        sent = ids_of(core->gossip_payload());
        REQUIRE(sent.size() == 3);
        REQUIRE(sent[1] != sent[2]);
    }
}

TEST_CASE("swim: the same seed makes the same choices") {
    SwimSettings settings;
    settings.full_view_max = 4;
    auto a = core_with(50, settings, 11), b = core_with(50, settings, 11),
         c = core_with(50, settings, 12);
    bool differs = false;
    for (int period = 0; period < 30; period++) {
        const auto pa = a->tick(t0), pb = b->tick(t0), pc = c->tick(t0);
        REQUIRE(pa.probe->node_id == pb.probe->node_id);
        REQUIRE(pa.gossip->node_id == pb.gossip->node_id);
        REQUIRE(ids_of(a->gossip_payload()) == ids_of(b->gossip_payload()));
        REQUIRE(ids_of(a->indirect_helpers(1)) == ids_of(b->indirect_helpers(1)));
        differs = differs || pa.probe->node_id != pc.probe->node_id;
        c->gossip_payload();
        c->indirect_helpers(1);
    }
    REQUIRE(differs);
}

TEST_CASE("member table: a random sample is k distinct reachable members, in O(k) when large") {
    MemberTable table(member(100), {1000ms, 5000ms, 4096});
    for (uint64_t id = 1; id <= 1000; id++)
        table.merge(member(id, 5, id % 10 == 0 ? MemberState::Suspect : MemberState::Alive), t0);
    for (uint64_t id = 1; id <= 1000; id += 3) table.merge(member(id, 5, MemberState::Left), t0);
    std::mt19937_64 rng(3);
    std::set<uint64_t> seen;
    for (int draw = 0; draw < 500; draw++) {
        const auto sample = ids_of(table.sample_reachable(8, 500, rng));
        REQUIRE(sample.size() == 8);
        REQUIRE(std::set<uint64_t>(sample.begin(), sample.end()).size() == 8);
        for (const uint64_t id : sample) {
            REQUIRE(id != 500);
            REQUIRE(id % 3 != 1);  // left
            seen.insert(id);
        }
    }
    // 666 reachable members but 500: 4000 draws reach nearly all of them.
    REQUIRE(seen.size() > 600);
    // Mostly gone: the draw falls back to a shuffle and still finds the few reachable.
    MemberTable sparse(member(100), {1000ms, 5000ms, 4096});
    for (uint64_t id = 1; id <= 200; id++)
        sparse.merge(member(id, 5, id <= 3 ? MemberState::Alive : MemberState::Dead), t0);
    REQUIRE(sparse.others_count() == 3);  // dead strangers are not added
    for (uint64_t id = 4; id <= 200; id++) {
        sparse.merge(member(id), t0);
        sparse.merge(member(id, 6, MemberState::Dead), t0);
    }
    auto few = ids_of(sparse.sample_reachable(2, 0, rng));
    REQUIRE(few.size() == 2);
    for (const uint64_t id : few) REQUIRE(id <= 3);
}

TEST_CASE("member table: expiry and purge keep the dense table's index right") {
    MemberTable table(member(100), {1000ms, 5000ms, 4096});
    for (uint64_t id = 1; id <= 6; id++) table.merge(member(id), t0);
    table.suspect(2, t0);
    table.suspect(5, t0);
    table.merge(member(3, 5, MemberState::Left), t0);
    REQUIRE(table.expire(t0 + 1s) == std::vector<uint64_t>{2, 5});
    // Past retention 2, 3 and 5 are purged; the others are still found by id, unchanged.
    table.expire(t0 + 7s);
    REQUIRE(table.others_count() == 3);
    for (const uint64_t id : {1, 4, 6}) REQUIRE(table.find(id)->address == member(id).address);
    for (const uint64_t id : {2, 3, 5}) REQUIRE_FALSE(table.find(id));
    // Stale news of a purged member lists it dead again at the incarnation it went at; a new
    // incarnation is let in.
    REQUIRE(table.merge(member(2, 4), t0 + 8s) == MemberTable::Merge::Updated);
    REQUIRE(table.find(2)->state == MemberState::Dead);
    REQUIRE(table.find(2)->incarnation == 5);
    REQUIRE(table.merge(member(2, 5, MemberState::Dead), t0 + 8s) == MemberTable::Merge::Ignored);
    REQUIRE(table.merge(member(2, 9), t0 + 8s) == MemberTable::Merge::Updated);
    REQUIRE(table.find(2)->state == MemberState::Alive);
    REQUIRE(table.find(2)->incarnation == 9);
    REQUIRE(table.others_count() == 4);
}

TEST_CASE("seed retries: a seed that is no member is due now, then after a doubling backoff") {
    SeedRetries seeds(1000ms, 8000ms);
    seeds.add("a:1");
    const auto nobody = [](const std::string&) { return false; };
    const std::vector<std::string> a{"a:1"};
    REQUIRE(seeds.due(t0, nobody) == a);
    // Failing again and again: due after 1, 2, 4, 8, 8 s, not a millisecond sooner.
    SteadyClock::time_point at = t0;
    for (const auto wait : {1000ms, 2000ms, 4000ms, 8000ms, 8000ms}) {
        seeds.tried("a:1", false, at);
        REQUIRE(seeds.due(at + wait - 1ms, nobody).empty());
        at += wait;
        REQUIRE(seeds.due(at, nobody) == a);
    }
    // Joined but still no member by its address (a service's name): every 8 s.
    seeds.tried("a:1", true, at);
    REQUIRE(seeds.due(at + 7999ms, nobody).empty());
    REQUIRE(seeds.due(at + 8000ms, nobody) == a);
    // A seed found to be a member starts over: due the moment it stops being one.
    seeds.tried("a:1", false, at);
    seeds.tried("a:1", false, at);
    const auto member = [](const std::string& seed) { return seed == "a:1"; };
    REQUIRE(seeds.due(at + 8000ms, member).empty());
    REQUIRE(seeds.due(at + 8001ms, nobody) == a);
    seeds.add("b:1");
    REQUIRE(seeds.seeds() == std::vector<std::string>{"a:1", "b:1"});
}
