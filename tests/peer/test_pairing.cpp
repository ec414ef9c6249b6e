// Partner choice: the rules of a PairingBook on their own, then real nodes pairing over gRPC.
// Expectations come from the whole round's matching worked out here (whole_matching) and from
// counting: pairs are mutual, nobody is in two pairs.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <limits>
#include <map>
#include <thread>
#include <tuple>

#include "common/random.h"
#include "peer/auth.h"
#include "peer/local_cluster.h"
#include "peer/pairing.h"
#include "peer/partner_choice.h"
#include "peer/wire.h"
#include "starling/v1/peer.grpc.pb.h"
#include "tests/peer/cluster_util.h"

using namespace starling;
using namespace starling::test;
using namespace std::chrono_literals;

namespace {

const std::vector<uint64_t> kEight{11, 22, 33, 44, 55, 66, 77, 88};

PairProposal random_proposal(uint64_t from, uint64_t round, uint64_t nonce = 1) {
    return {from, round, nonce, PairMode::Random, 0};
}

// A callee at `round` whose view has `digest` and names `partner` for the proposal's round.
PairingView view_with(uint64_t round, uint64_t digest, std::optional<uint64_t> partner) {
    return {round, [=] { return DeterministicView{digest, partner}; }};
}

PairingView view_at(uint64_t round) { return view_with(round, 0, std::nullopt); }

std::vector<PeerNode*> wait_for_one_view(LocalCluster& cluster) {
    const auto nodes = nodes_of(cluster);
    wait_for("one view", 20000ms,
             [&] { return all_see_all_alive(nodes) && same_pairable_view(nodes); });
    return nodes;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Rules

// The whole round's matching as pairing.h describes it, worked out for every member at once: a
// member's bucket at level j is the number of members (of the whole view) up to it in key order
// whose key ends in j or more zero base-4 digits. First, level by level, each bucket pairs each
// private member with the next public one, the rest going on, until a level with one bucket; then,
// level by level again, each bucket pairs those left as neighbours, one going on where odd.
std::map<uint64_t, uint64_t> whole_matching(uint64_t round, const std::vector<uint64_t>& view,
                                            const std::vector<uint64_t>& hidden) {
    const uint64_t seed = hash_index(round, kMatchingSalt);
    std::vector<std::pair<uint64_t, uint64_t>> keyed;  // (key, id)
    for (const uint64_t id : view) keyed.emplace_back(hash_index(seed, id), id);
    std::sort(keyed.begin(), keyed.end());
    const auto is_private = [&](uint64_t id) {
        return std::find(hidden.begin(), hidden.end(), id) != hidden.end();
    };
    const auto zero_digits = [](uint64_t key) {
        int digits = 0;
        while (digits < 32 && (key & 3) == 0) {
            key >>= 2;
            ++digits;
        }
        return digits;
    };
    const auto bucket_at = [&](uint64_t key, int level) {
        size_t starts = 0;
        for (const auto& other : keyed)
            starts += view.size() > kMatchingBucketedPast && other.first <= key &&
                      zero_digits(other.first) >= level;
        return starts;
    };
    const auto one_bucket_at = [&](int level) {
        return bucket_at(std::numeric_limits<uint64_t>::max(), level) == 0;
    };
    std::map<uint64_t, uint64_t> partner;
    const auto pair = [&](uint64_t a, uint64_t b) {
        partner[a] = b;
        partner[b] = a;
    };
    std::vector<std::pair<uint64_t, uint64_t>> alone = keyed;
    for (const bool cross : {true, false}) {
        for (int level = 1;; level++) {
            std::map<size_t, std::vector<uint64_t>> buckets;
            for (const auto& [key, id] : alone) buckets[bucket_at(key, level)].push_back(id);
            std::set<uint64_t> left;
            for (const auto& [start, ids] : buckets) {
                std::vector<uint64_t> priv, pub;
                for (const uint64_t id : ids) (is_private(id) ? priv : pub).push_back(id);
                if (cross) {
                    size_t i = 0;
                    for (; i < priv.size() && i < pub.size(); i++) pair(priv[i], pub[i]);
                    left.insert(priv.begin() + std::min(i, priv.size()), priv.end());
                    left.insert(pub.begin() + std::min(i, pub.size()), pub.end());
                } else {
                    size_t i = 0;
                    for (; i + 1 < ids.size(); i += 2) pair(ids[i], ids[i + 1]);
                    if (i < ids.size()) left.insert(ids[i]);
                }
            }
            std::erase_if(alone, [&](const auto& placed) { return !left.contains(placed.second); });
            if (one_bucket_at(level)) break;
        }
    }
    return partner;
}

std::vector<uint64_t> ids_from(uint64_t seed, size_t n) {
    std::vector<uint64_t> ids;
    for (size_t i = 0; i < n; i++) ids.push_back(hash_index(seed, i));
    return ids;
}

TEST_CASE("deterministic_partner gives each member its partner in the round's whole matching") {
    for (const size_t n : {1, 2, 5, 8, 64, 65, 200, 1001}) {
        const auto view = ids_from(n, n);
        for (const size_t private_every : {0, 2, 3}) {
            std::vector<uint64_t> hidden;
            for (size_t i = 0; private_every && i < n; i += private_every)
                hidden.push_back(view[i]);
            for (uint64_t round = 1; round <= 3; ++round) {
                INFO(n << " members, " << hidden.size() << " private, round " << round);
                const auto whole = whole_matching(round, view, hidden);
                size_t alone = 0;
                for (const uint64_t id : view) {
                    const auto partner = deterministic_partner(round, view, id, hidden);
                    const auto it = whole.find(id);
                    REQUIRE(partner == (it == whole.end() ? std::nullopt
                                                          : std::optional<uint64_t>(it->second)));
                    alone += !partner;
                }
                // Every member pairs but one when their number is odd.
                CHECK(alone == n % 2);
            }
        }
    }
    CHECK(deterministic_partner(3, kEight, 99) == std::nullopt);
}

TEST_CASE(
    "views that differ in a few members keep the deterministic partners of nearly all others") {
    // 3,000 members; another node's view lacks 10 of them and lists 5 it does not (a few
    // seconds of churn at this size). Their partners differ only for a few members near each
    // difference at each level: 96-97% keep theirs (measured over these rounds), where a matching
    // drawn from the whole view's digest would keep about none.
    // With every second member private, 88-90% keep theirs: the members each level leaves to the
    // next are more, and a difference changes which.
    const size_t private_every = GENERATE(0, 2);
    const auto view = ids_from(7, 3000);
    std::vector<uint64_t> other(view.begin() + 10, view.end());
    for (const uint64_t id : ids_from(8, 5)) other.push_back(id);
    std::vector<uint64_t> hidden;
    for (size_t i = 0; private_every && i < view.size(); i += private_every)
        hidden.push_back(view[i]);
    for (uint64_t round = 1; round <= 5; ++round) {
        size_t same = 0;
        for (auto it = view.begin() + 10; it != view.end(); ++it)
            same += deterministic_partner(round, view, *it, hidden) ==
                    deterministic_partner(round, other, *it, hidden);
        INFO(hidden.size() << " private, round " << round << ": " << same
                           << " of 2990 keep their partner");
        CHECK(same >= 2990 * (private_every ? 85 : 93) / 100);
    }
}

TEST_CASE("with private members, deterministic pairs join each private member to a public one") {
    const std::vector<uint64_t> small{11, 22, 33, 44, 55, 66, 77, 88, 99, 111};
    // Past kMatchingBucketedPast members too, where the view is cut into buckets.
    const auto large = ids_from(3, 301);
    std::vector<uint64_t> large_third, large_two_thirds;
    for (size_t i = 0; i < large.size(); i++)
        (i % 3 == 0 ? large_third : large_two_thirds).push_back(large[i]);
    for (const auto& [view, hidden] :
         {std::pair{small, std::vector<uint64_t>{22, 55, 88, 111}},
          std::pair{small, std::vector<uint64_t>{11, 22, 33, 44, 55, 66, 77}},
          std::pair{large, large_third}, std::pair{large, large_two_thirds}}) {
        INFO(view.size() << " members, " << hidden.size() << " private");
        const auto is_private = [&](uint64_t id) {
            return std::find(hidden.begin(), hidden.end(), id) != hidden.end();
        };
        const size_t publics = view.size() - hidden.size();
        const size_t crossing = std::min(hidden.size(), publics);
        std::set<std::set<std::vector<uint64_t>>> matchings;
        for (uint64_t round = 0; round < 20; ++round) {
            size_t crossed = 0, open = 0, relayed = 0, alone = 0;
            std::set<std::vector<uint64_t>> pairs;
            for (const uint64_t id : view) {
                const auto partner = deterministic_partner(round, view, id, hidden);
                if (!partner) {
                    ++alone;
                    continue;
                }
                REQUIRE(deterministic_partner(round, view, *partner, hidden) == id);
                pairs.insert({std::min(id, *partner), std::max(id, *partner)});
                if (is_private(id) != is_private(*partner))
                    ++crossed;
                else
                    (is_private(id) ? relayed : open)++;
            }
            // As many direct pairs as the kinds allow; the rest pair among their kind, private
            // ones through a relay, and one is alone when an odd number is left.
            CHECK(crossed == 2 * crossing);
            CHECK(open == 2 * ((publics - crossing) / 2));
            CHECK(relayed == 2 * ((hidden.size() - crossing) / 2));
            CHECK(alone == view.size() - crossed - open - relayed);
            CHECK(alone <= 1);
            matchings.insert(pairs);
        }
        // The draw changes with the round.
        CHECK(matchings.size() >= 15);
    }
    // An id outside the view named private changes nothing.
    for (uint64_t round = 0; round < 6; ++round)
        for (const uint64_t id : kEight)
            CHECK(deterministic_partner(round, kEight, id, std::vector<uint64_t>{5}) ==
                  deterministic_partner(round, kEight, id));
}

TEST_CASE(
    "a deterministic proposal is accepted only when the callee's matching names the proposer") {
    PairingBook book(11, 1);
    book.open(5);
    const PairProposal proposal{22, 5, 7, PairMode::Deterministic, 0xabc};
    SECTION("views differ, but both name each other") {
        CHECK(book.consider(proposal, view_with(5, 0xdef, 22)).accepted);
    }
    SECTION("views differ, and the callee's names another node") {
        const auto answer = book.consider(proposal, view_with(5, 0xdef, 33));
        CHECK_FALSE(answer.accepted);
        CHECK_THAT(answer.reason, Catch::Contains("deterministic partner for round 5 is node"));
        CHECK_THAT(answer.reason, Catch::Contains("membership views differ"));
    }
    SECTION("the callee's matching names another node") {
        const auto answer = book.consider(proposal, view_with(5, 0xabc, 33));
        CHECK_FALSE(answer.accepted);
        CHECK_THAT(answer.reason, Catch::Contains("deterministic partner"));
        CHECK_THAT(answer.reason, !Catch::Contains("views differ"));
    }
    SECTION("the callee is alone in its matching") {
        CHECK_FALSE(book.consider(proposal, view_with(5, 0xabc, std::nullopt)).accepted);
    }
    SECTION("both views agree") {
        CHECK(book.consider(proposal, view_with(5, 0xabc, 22)).accepted);
        CHECK(book.partner(5) == 22u);
        // Paired for the round: the same proposer again is fine, anyone else is refused.
        CHECK(book.consider(proposal, view_with(5, 0xabc, 22)).accepted);
        const auto other = book.consider(random_proposal(33, 5), view_at(5));
        CHECK_FALSE(other.accepted);
        CHECK_THAT(other.reason, Catch::Contains("already paired"));
        CHECK(book.partner(5) == 22u);
    }
    if (!book.partner(5)) CHECK(book.consider(random_proposal(33, 5), view_at(5)).accepted);
}

TEST_CASE("the callee's matching is read only for a deterministic proposal it would take") {
    PairingBook book(11, 1);
    int reads = 0;
    const PairingView counted{5, [&] {
                                  ++reads;
                                  return DeterministicView{0xabc, 22};
                              }};
    // Not choosing for round 5 yet: declined before the matching matters.
    CHECK_FALSE(book.consider({22, 5, 7, PairMode::Deterministic, 0xabc}, counted).accepted);
    book.open(5);
    CHECK_FALSE(book.consider({22, 6, 7, PairMode::Deterministic, 0xabc}, counted).accepted);
    CHECK(reads == 0);
    CHECK(book.consider(random_proposal(33, 5), counted).accepted);
    CHECK(reads == 0);
    // Paired with 33 now: a deterministic proposal from 22 is declined as already paired.
    CHECK_FALSE(book.consider({22, 5, 7, PairMode::Deterministic, 0xabc}, counted).accepted);
    CHECK(reads == 0);
    PairingBook other(11, 1);
    other.open(5);
    CHECK(other.consider({22, 5, 7, PairMode::Deterministic, 0xabc}, counted).accepted);
    CHECK(reads == 1);
}

TEST_CASE("a proposal is accepted only for the round the node is choosing for, while it chooses") {
    PairingBook fresh(11, 1);
    CHECK(fresh.consider(random_proposal(22, 0), view_at(0))
              .ask_again);  // a new node training round 0

    PairingBook book(11, 1);
    const auto far = book.consider(random_proposal(22, 12), view_at(10));
    CHECK_FALSE(far.accepted);
    CHECK_THAT(far.reason, Catch::Contains("more than 1 round"));

    // Training toward round 11 (the last round chosen was 10): not yet, ask again.
    const auto early = book.consider(random_proposal(22, 11), view_at(10));
    CHECK_FALSE(early.accepted);
    CHECK(early.ask_again);
    CHECK_THAT(early.reason, Catch::Contains("not choosing a partner for round 11 now"));
    CHECK(book.partner(11) == std::nullopt);

    book.open(11);
    // A straggler still at round 10: this node has chosen for round 10 already, for good.
    const auto late = book.consider(random_proposal(33, 10), view_at(11));
    CHECK_FALSE(late.accepted);
    CHECK_FALSE(late.ask_again);
    CHECK(book.consider(random_proposal(22, 11), view_at(11)).accepted);
    CHECK(book.partner(11) == 22u);
    book.close(11);

    // Exchanging round 11 with 22: a proposal for 12 waits until this node gets there, one for 11
    // from anyone else is refused, 22's again is still the pairing.
    const auto next = book.consider(random_proposal(44, 12), view_at(11));
    CHECK_FALSE(next.accepted);
    CHECK(next.ask_again);
    CHECK_FALSE(book.consider(random_proposal(44, 11), view_at(11)).accepted);
    CHECK(book.consider(random_proposal(22, 11), view_at(11)).accepted);
    CHECK(book.partner(12) == std::nullopt);
}

TEST_CASE("a node with a proposal out declines everyone but the node it proposed to") {
    PairingBook book(11, 1);
    book.open(5);
    REQUIRE(book.begin_proposal(5, 22, 100));
    CHECK(book.proposing_to(5, 22));
    CHECK_FALSE(book.proposing_to(5, 33));
    REQUIRE_FALSE(book.begin_proposal(5, 33, 101));
    const auto busy = book.consider(random_proposal(33, 5), view_at(5));
    CHECK_FALSE(busy.accepted);
    CHECK(busy.ask_again);
    CHECK_THAT(busy.reason, Catch::Contains("busy"));
    CHECK(book.end_proposal(5, false) == std::nullopt);
    CHECK(book.consider(random_proposal(33, 5), view_at(5)).accepted);
    CHECK_FALSE(book.begin_proposal(5, 22, 102));
}

TEST_CASE("crossing proposals settle on the lower (nonce, node id) and both sides agree") {
    const auto [nonce_a, nonce_b] =
        GENERATE(std::make_pair(10u, 20u), std::make_pair(20u, 10u), std::make_pair(7u, 7u));
    const auto mode = GENERATE(PairMode::Random, PairMode::Deterministic);
    PairingBook a(11, 1), b(22, 1);
    a.open(5);
    b.open(5);
    REQUIRE(a.begin_proposal(5, 22, nonce_a));
    REQUIRE(b.begin_proposal(5, 11, nonce_b));
    const PairingView view_a{5,
                             [] {
                                 return DeterministicView{0xabc, 22};
                             }},
        view_b{5, [] {
                   return DeterministicView{0xabc, 11};
               }};
    const auto at_a = a.consider({22, 5, nonce_b, mode, 0xabc}, view_a);
    const auto at_b = b.consider({11, 5, nonce_a, mode, 0xabc}, view_b);
    const bool a_wins = std::make_tuple(nonce_a, 11) < std::make_tuple(nonce_b, 22);
    CHECK(at_b.accepted == a_wins);
    CHECK(at_a.accepted == !a_wins);
    CHECK(at_a.crossed == a_wins);
    CHECK(at_b.crossed == !a_wins);
    a.end_proposal(5, at_b.accepted);
    b.end_proposal(5, at_a.accepted);
    CHECK(a.partner(5) == 22u);
    CHECK(b.partner(5) == 11u);
}

TEST_CASE("await_partner returns when a proposal is accepted, or at its deadline") {
    PairingBook book(11, 1);
    book.open(5);
    REQUIRE(book.begin_proposal(5, 22, 50));
    CHECK(book.await_partner(5, SteadyClock::now() + 50ms) == std::nullopt);
    std::thread winner([&] {
        std::this_thread::sleep_for(50ms);
        book.consider(random_proposal(22, 5, 1), view_at(5));
    });
    CHECK(book.await_partner(5, SteadyClock::now() + 10s) == 22u);
    winner.join();
    CHECK(book.end_proposal(5, false) == 22u);
}

TEST_CASE("a pairing book keeps a few rounds however long it runs, and knows the recent partners") {
    PairingBook book(11, 1);
    for (uint64_t round = 1; round <= 100; ++round) {
        book.open(round);
        REQUIRE(book.consider(random_proposal(1000 + round, round), view_at(round)).accepted);
        book.close(round);
    }
    CHECK(book.rounds_held() <= PairingBook::kRoundsKept + 1);
    CHECK(book.partner(100) == 1100u);
    CHECK(book.partner(50) == std::nullopt);
    auto recent = book.recent_partners(101, kRecentPartnerRounds);
    std::sort(recent.begin(), recent.end());
    CHECK(recent == std::vector<uint64_t>{1097, 1098, 1099, 1100});
}

TEST_CASE("done with a round: chose a partner for it (or none) or is past it, as its digest says") {
    Member m;
    m.round = 10;
    CHECK_FALSE(done_with(m, 10));  // choosing for 10, or about to
    m.solo_through = 10;            // solo in round 9
    CHECK_FALSE(done_with(m, 10));
    m.paired_through = 11;  // paired for 10: now training 11
    CHECK(done_with(m, 10));
    CHECK_FALSE(done_with(m, 11));
    m.paired_through = 0;
    m.solo_through = 11;  // solo in 10
    CHECK(done_with(m, 10));
    m.solo_through = 0;
    m.round = 11;  // choosing for 11
    CHECK(done_with(m, 10));
    CHECK_FALSE(done_with(m, 12));
}

TEST_CASE("random candidates: other pairable members within the round gap, recent partners last") {
    std::vector<Member> pairable;
    for (uint64_t id : {11, 22, 33, 44, 55, 66, 77, 88}) {
        Member m;
        m.node_id = id;
        m.round = id == 33 ? 7 : 10;          // 33 lags three rounds
        if (id == 77) m.paired_through = 11;  // done with round 10: never asked for it
        if (id == 88) m.round = 11;           // past round 10
        pairable.push_back(m);
    }
    const std::vector<uint64_t> recent{44, 66};
    std::set<std::vector<uint64_t>> orders;
    for (uint64_t seed = 0; seed < 32; seed++) {
        const auto order = random_candidates(pairing_facts(pairable), 11, 10, 1, recent, seed);
        REQUIRE(order.size() == 4);
        CHECK(std::set<uint64_t>(order.begin(), order.begin() + 2) == std::set<uint64_t>{22, 55});
        CHECK(std::set<uint64_t>(order.begin() + 2, order.end()) == std::set<uint64_t>{44, 66});
        orders.insert(order);
        // The member table's order does not change the draw.
        auto reversed = pairable;
        std::reverse(reversed.begin(), reversed.end());
        CHECK(random_candidates(pairing_facts(reversed), 11, 10, 1, recent, seed) == order);
    }
    CHECK(orders.size() == 4);  // both halves shuffled: 2 x 2 orders
    auto wide = random_candidates(pairing_facts(pairable), 11, 10, 3, {}, 7);
    std::sort(wide.begin(), wide.end());
    CHECK(wide == std::vector<uint64_t>{22, 33, 44, 55, 66});
    // Only recent partners within reach: they are still candidates.
    CHECK(random_candidates(pairing_facts(pairable), 11, 10, 0,
                            std::vector<uint64_t>{22, 44, 55, 66}, 3)
              .size() == 4);
    // A private node asks private members after all the others, recent partners included: an
    // exchange with them takes a relay. A public one asks them as any other.
    pairable[1].reachability = Reachability::Private;  // 22
    pairable[3].reachability = Reachability::Private;  // 44, a recent partner
    for (uint64_t seed = 0; seed < 16; seed++) {
        const auto order =
            random_candidates(pairing_facts(pairable), 11, 10, 1, recent, seed, false);
        REQUIRE(order.size() == 4);
        CHECK(order == std::vector<uint64_t>{55, 66, 22, 44});
        const auto as_public =
            random_candidates(pairing_facts(pairable), 11, 10, 1, recent, seed, true);
        CHECK(std::set<uint64_t>(as_public.begin(), as_public.begin() + 2) ==
              std::set<uint64_t>{22, 55});
    }
}

TEST_CASE("random candidates: within each part, the members heard from lately first") {
    using namespace std::chrono_literals;
    const SteadyClock::time_point since = SteadyClock::time_point{} + 100s;
    std::vector<PairingFacts> pairable;
    for (uint64_t id = 1; id <= 8; id++) {
        PairingFacts m{.node_id = id, .round = 10, .callable = true, .proposable = true};
        // Heard since: 2, 4 (a recent partner), 6 and 8 (private); 7 heard exactly then.
        if (id % 2 == 0) m.heard = since + 1s;
        if (id == 7) m.heard = since;
        if (id == 5) m.heard = since - 1s;
        m.callable = id < 6;
        pairable.push_back(m);
    }
    const std::vector<uint64_t> recent{3, 4};
    for (uint64_t seed = 0; seed < 16; seed++) {
        // As a private node: direct (not recent: heard 2, then 1 and 5; recent: heard 4, then 3),
        // then the private members it reaches through a relay (heard 6, 7, 8 before none).
        const auto order = random_candidates(pairable, 99, 10, 1, recent, seed, false, since);
        REQUIRE(order.size() == 8);
        CHECK(order[0] == 2);
        CHECK(std::set<uint64_t>(order.begin() + 1, order.begin() + 3) == std::set<uint64_t>{1, 5});
        CHECK(order[3] == 4);
        CHECK(order[4] == 3);
        CHECK(std::set<uint64_t>(order.begin() + 5, order.end()) == std::set<uint64_t>{6, 7, 8});
        // Without a time, as before: heard or not does not matter.
        const auto any = random_candidates(pairable, 99, 10, 1, recent, seed, false);
        CHECK(std::set<uint64_t>(any.begin(), any.begin() + 3) == std::set<uint64_t>{1, 2, 5});
    }
}

// As many adopters as members: every node adopts every left-out member.
constexpr double kEveryone = 1000;

TEST_CASE("left-out members: solo in their last choice, within the gap, never ahead") {
    // Node 11 chooses for round 10 with a gap of 1.
    // A member advertises the round it last chose for (or chooses for now); `last` is the round
    // of its last choice, `solo` what that choice found.
    struct Seen {
        uint64_t id, round, last;
        bool solo;
    };
    const std::vector<Seen> seen{
        {11, 10, 9, true},    // self, solo last round too: never its own candidate
        {22, 10, 9, false},   // paired last round: not left out
        {33, 10, 9, true},    // solo last round, choosing now: left out
        {44, 9, 9, true},     // solo in round 9, training toward 10: left out, among the behind
        {55, 8, 8, true},     // two rounds behind: past the gap
        {66, 11, 10, true},   // ahead: it chooses for round 11, not 10
        {77, 10, 9, true},    // left out
        {88, 9, 9, false},    // a round behind but paired in it: not left out
        {99, 10, 0, false},   // a fresh member, no choice made yet: not left out
        {111, 10, 10, true},  // solo in round 10 already: done with it, not asked
    };
    std::vector<Member> pairable;
    for (const Seen& s : seen) {
        Member m;
        m.node_id = s.id;
        m.round = s.round;
        if (s.id != 99) (s.solo ? m.solo_through : m.paired_through) = s.last + 1;
        if (s.id != 99) (s.solo ? m.paired_through : m.solo_through) = s.last - 1;
        pairable.push_back(m);
    }
    std::set<std::vector<uint64_t>> orders;
    for (uint64_t seed = 0; seed < 32; seed++) {
        const auto order = left_out_members(pairing_facts(pairable), 11, 10, 1, seed, kEveryone);
        REQUIRE(order.size() == 3);
        // Those at the round first: they are choosing now or about to.
        CHECK(std::set<uint64_t>(order.begin(), order.begin() + 2) == std::set<uint64_t>{33, 77});
        CHECK(order[2] == 44);
        auto reversed = pairable;
        std::reverse(reversed.begin(), reversed.end());
        CHECK(left_out_members(pairing_facts(reversed), 11, 10, 1, seed, kEveryone) == order);
        orders.insert(order);
    }
    CHECK(orders.size() == 2);
    // With a gap of 0 only those at the round count; with 2, the one two rounds behind too.
    auto narrow = left_out_members(pairing_facts(pairable), 11, 10, 0, 3, kEveryone);
    std::sort(narrow.begin(), narrow.end());
    CHECK(narrow == std::vector<uint64_t>{33, 77});
    CHECK(left_out_members(pairing_facts(pairable), 11, 10, 2, 3, kEveryone).size() == 4);
    // Everyone paired last round: nobody is left out.
    for (Member& m : pairable) m.paired_through = m.solo_through + 1;
    CHECK(left_out_members(pairing_facts(pairable), 11, 10, 1, 3, kEveryone).empty());
}

TEST_CASE("left-out members are adopted by about kLeftOutAdopters members each, anew each round") {
    // 1,000 members, 20 of them left out: count, per left-out member and round, who adopts it.
    constexpr size_t kMembers = 1000;
    std::vector<size_t> adopters;
    for (uint64_t round = 1; round <= 5; round++)
        for (uint64_t left = 0; left < 20; left++) {
            size_t count = 0;
            for (uint64_t self = 100; self < 100 + kMembers; self++)
                count += adopts(self, left, round, kMembers, kLeftOutAdopters);
            adopters.push_back(count);
        }
    // A binomial(1000, 0.003) per member: mean 3 over the 100 draws within 3.0 +- 0.6 (3.5
    // standard errors), and never a crowd.
    double mean = 0;
    for (size_t c : adopters) mean += static_cast<double>(c) / adopters.size();
    CHECK(mean == Approx(3.0).margin(0.6));
    CHECK(*std::max_element(adopters.begin(), adopters.end()) <= 12);
    // The same draw every time; another round another draw; a small view: everyone adopts.
    CHECK(adopts(5, 6, 7, kMembers, 3) == adopts(5, 6, 7, kMembers, 3));
    size_t same = 0;
    for (uint64_t self = 0; self < 2000; self++)
        same += adopts(self, 1, 1, 10, 3) == adopts(self, 1, 2, 10, 3);
    CHECK(same < 2000);
    for (uint64_t self = 0; self < 100; self++) CHECK(adopts(self, 1, 1, 3, 3));
}

// ---------------------------------------------------------------------------------------------
// PartnerChoice: the proposer's steps, on a clock the test moves (5 s pair timeout: left-out
// members until 3.75 s, the deterministic partner alone until 2.5 s)

namespace {

const SteadyClock::time_point kT0{};

PartnerChoice choice_of(std::optional<uint64_t> intended, std::vector<uint64_t> candidates,
                        std::vector<uint64_t> left_out = {}) {
    return PartnerChoice({intended, std::move(candidates), std::move(left_out), kT0, 5000ms});
}

void check_propose(const ChoiceStep& step, uint64_t to, PairMode mode) {
    CHECK(step.kind == ChoiceStep::Kind::Propose);
    CHECK(step.to == to);
    CHECK(step.mode == mode);
}

void check_listen(const ChoiceStep& step, SteadyClock::time_point until) {
    CHECK(step.kind == ChoiceStep::Kind::Listen);
    CHECK(step.until == until);
}

}  // namespace

TEST_CASE("partner choice: the deterministic partner alone until half the timeout, then others") {
    auto choice = choice_of(22, {33, 22, 44});
    check_propose(choice.next(kT0, false), 22, PairMode::Deterministic);
    choice.answered(false, true);  // not choosing for the round yet
    // Before half the budget nobody else is asked: listen for the retry interval.
    check_listen(choice.next(kT0 + 1ms, false), kT0 + 1ms + kPairRetry);
    check_propose(choice.next(kT0 + 2600ms, false), 22, PairMode::Deterministic);
    choice.answered(false, true);
    // Past half the budget a random member is asked right after it, never 22 while it may yet come.
    check_propose(choice.next(kT0 + 2700ms, false), 33, PairMode::Random);
    choice.answered(false, true);
    check_listen(choice.next(kT0 + 2700ms, false), kT0 + 2700ms + kPairRetry);
    check_propose(choice.next(kT0 + 2800ms, false), 22, PairMode::Deterministic);
    choice.answered(false, true);
    check_propose(choice.next(kT0 + 2800ms, false), 44, PairMode::Random);
    choice.answered(true, false);
    CHECK(choice.next(kT0 + 2800ms, true).kind == ChoiceStep::Kind::Done);
}

TEST_CASE("partner choice: a declined deterministic partner sends the node to random members") {
    auto choice = choice_of(22, {22, 33});
    check_propose(choice.next(kT0, false), 22, PairMode::Deterministic);
    choice.answered(false, false);  // its matching names another: for good
    // At once, and now 22 may be asked at random like anyone.
    check_propose(choice.next(kT0, false), 22, PairMode::Random);
    choice.answered(false, false);
    check_listen(choice.next(kT0, false), kT0 + kPairRetry);
    check_propose(choice.next(kT0 + 100ms, false), 33, PairMode::Random);
    choice.answered(false, true);
    check_listen(choice.next(kT0 + 100ms, false), kT0 + 200ms);
    // 22 declined for good and is not asked again; 33 is, until the deadline.
    check_propose(choice.next(kT0 + 200ms, false), 33, PairMode::Random);
    choice.answered(false, true);
    check_listen(choice.next(kT0 + 4950ms, false), kT0 + 5000ms);
    CHECK(choice.next(kT0 + 5000ms, false).kind == ChoiceStep::Kind::Done);
    CHECK(choice.deadline() == kT0 + 5000ms);
}

TEST_CASE("partner choice: no deterministic partner, everyone declines for good: done early") {
    auto choice = choice_of(std::nullopt, {33, 44});
    check_propose(choice.next(kT0, false), 33, PairMode::Random);
    choice.answered(false, false);
    check_listen(choice.next(kT0, false), kT0 + kPairRetry);
    check_propose(choice.next(kT0 + 100ms, false), 44, PairMode::Random);
    choice.answered(false, false);
    CHECK(choice.next(kT0 + 100ms, false).kind == ChoiceStep::Kind::Done);
}

TEST_CASE("partner choice: members left out are asked first, each followed by a pause") {
    auto choice = choice_of(22, {22, 33, 44}, {44, 55});
    check_propose(choice.next(kT0, false), 44, PairMode::Random);
    choice.answered(false, true);
    check_listen(choice.next(kT0, false), kT0 + kPairRetry);
    check_propose(choice.next(kT0 + 100ms, false), 55, PairMode::Random);
    choice.answered(false, false);  // for good: asked neither as left out nor at random again
    check_listen(choice.next(kT0 + 100ms, false), kT0 + 200ms);
    check_propose(choice.next(kT0 + 200ms, false), 44, PairMode::Random);
    choice.answered(false, true);
    // Past the left-out share of the budget the usual order resumes.
    check_listen(choice.next(kT0 + 3800ms, false), kT0 + 3900ms);
    check_propose(choice.next(kT0 + 3900ms, false), 22, PairMode::Deterministic);
    choice.answered(false, true);
    check_propose(choice.next(kT0 + 3900ms, false), 33, PairMode::Random);
    // A partner recorded meanwhile (a proposal to us accepted) ends the choice.
    choice.answered(true, false);
    CHECK(choice.next(kT0 + 3900ms, true).kind == ChoiceStep::Kind::Done);
}

// ---------------------------------------------------------------------------------------------
// Real nodes

TEST_CASE("eight nodes: every node gets its deterministic partner in each of three rounds") {
    LocalCluster cluster(8);
    const auto nodes = wait_for_one_view(cluster);
    const auto view = nodes.front()->pairable_ids();
    for (uint64_t round = 1; round <= 3; ++round) {
        INFO("round " << round);
        const auto partners = choose_partners(nodes, round);
        CHECK(require_mutual(nodes, partners) == 0);
        // With one view everywhere, the first proposal of each node succeeds.
        for (size_t i = 0; i < nodes.size(); ++i)
            CHECK(partners[i] == deterministic_partner(round, view, nodes[i]->node_id()));
    }
}

TEST_CASE("five nodes: two mutual pairs and one solo node in every round") {
    // The deterministic matching of five leaves one node alone. Its random requests find every
    // other node paired or busy proposing; and if one reaches a node before that node has paired,
    // it takes it and leaves that node's deterministic partner alone instead. Either way exactly
    // one node is solo.
    LocalCluster cluster(5);
    const auto nodes = wait_for_one_view(cluster);
    for (uint64_t round = 1; round <= 3; ++round) {
        INFO("round " << round);
        CHECK(require_mutual(nodes, choose_partners(nodes, round)) == 1);
    }
}

TEST_CASE("a node that comes late to every choice still pairs in half of its rounds") {
    // Node 2 starts choosing 0.6 pair timeouts after the other two, every round: past the half
    // that the deterministic partner is waited for, within the share left-out members are. Without
    // that rule the two prompt nodes pair with each other every round and node 2 never pairs.
    PeerConfig config = local_cluster_config();
    config.pair_timeout = 4000ms;
    config.probe_timeout = 500ms;
    config.membership.suspicion_timeout = 5000ms;
    LocalCluster cluster(3, config);
    const auto nodes = wait_for_one_view(cluster);
    const auto late_by = config.pair_timeout * 6 / 10;
    // Each node's own last choice, as every other node has it from gossip.
    const auto choices_known = [&] {
        for (const PeerNode* observer : nodes)
            for (const PeerNode* other : nodes)
                for (const Member& m : observer->members())
                    if (m.node_id == other->node_id() &&
                        (m.paired_through != other->members().front().paired_through ||
                         m.solo_through != other->members().front().solo_through))
                        return false;
        return true;
    };
    constexpr uint64_t kRounds = 8;
    std::vector<int> paired(nodes.size(), 0);
    for (uint64_t round = 1; round <= kRounds; ++round) {
        INFO("round " << round);
        std::vector<std::optional<uint64_t>> partners(nodes.size());
        std::vector<std::thread> threads;
        for (size_t i = 0; i < nodes.size(); ++i) {
            threads.emplace_back([&, i] {
                if (i == 2) std::this_thread::sleep_for(late_by);
                if (const auto partner = nodes[i]->rounds().choose_partner(round))
                    partners[i] = partner->node_id;
            });
        }
        for (auto& thread : threads) thread.join();
        CHECK(require_mutual(nodes, partners) == 1);
        for (size_t i = 0; i < nodes.size(); ++i) paired[i] += partners[i].has_value();
        wait_for("every node knows the others' choices", 10000ms, choices_known);
    }
    INFO("paired rounds: " << paired[0] << ", " << paired[1] << ", " << paired[2] << " of "
                           << kRounds);
    // A node solo in one round is asked first in the next: node 2 alternates, the first round
    // (nobody solo yet) aside.
    CHECK(paired[2] >= static_cast<int>(kRounds / 2) - 1);
    for (int p : paired) CHECK(p >= static_cast<int>(kRounds / 2) - 1);
}

TEST_CASE("paired nodes know each other's round from the pairing itself, not from gossip") {
    // Gossip every 30 s: two nodes still meet at once (the join answers with the member list), but
    // no gossiped round arrives during the test.
    PeerConfig slow = local_cluster_config();
    slow.gossip_interval = 30s;
    LocalCluster cluster(2, slow);
    const auto nodes = wait_for_one_view(cluster);
    const auto round_seen = [](const PeerNode& observer, uint64_t id) {
        for (const Member& m : observer.members())
            if (m.node_id == id) return m.round;
        return uint64_t{0};
    };
    // Each node at round 6 first, as a daemon advertises its round when it starts: a node still at
    // round 0 declines a proposal for round 7 (more than max_round_gap away), and if one thread
    // proposed before the other had advertised, both would be solo.
    for (PeerNode* node : nodes) node->rounds().advertise(6);
    for (uint64_t round : {7, 8}) {
        REQUIRE(require_mutual(nodes, choose_partners(nodes, round)) == 0);
        CHECK(round_seen(*nodes[0], nodes[1]->node_id()) == round);
        CHECK(round_seen(*nodes[1], nodes[0]->node_id()) == round);
    }
}

TEST_CASE("a node with another model fingerprint is never chosen") {
    LocalCluster cluster(4);
    PeerNode& stranger = add_foreign_model_node(cluster);
    auto nodes = nodes_of(cluster);
    const std::vector<PeerNode*> compatible(nodes.begin(), nodes.begin() + 4);
    wait_for("one view", 20000ms,
             [&] { return all_see_all_alive(nodes) && same_pairable_view(compatible); });
    for (uint64_t round = 1; round <= 3; ++round) {
        INFO("round " << round);
        const auto partners = choose_partners(nodes, round);
        CHECK(partners.back() == std::nullopt);
        for (const auto& partner : partners) CHECK(partner != stranger.node_id());
        CHECK(require_mutual(compatible, {partners.begin(), partners.begin() + 4}) == 0);
    }
}

TEST_CASE(
    "a member quarantined by one node is neither chosen by it nor accepted, until its time is up") {
    // Four nodes with one view, where every node's first proposal, to its deterministic partner,
    // succeeds (the eight-node test). Node 0 refuses two of node 1's messages in a row in the
    // round before one where they are each other's deterministic partners: that quarantines node 1
    // for 8 rounds in node 0's eyes only. They do not pair then, nor in any round of the
    // quarantine, and do in the first round after it where they are each other's partners again.
    LocalCluster cluster(4);
    const auto nodes = wait_for_one_view(cluster);
    const auto view = nodes.front()->pairable_ids();
    const uint64_t faulty = nodes[1]->node_id();
    const auto partners_again = [&](uint64_t from) {
        uint64_t round = from;
        while (deterministic_partner(round, view, nodes[0]->node_id()) != faulty) round++;
        return round;
    };
    const uint64_t first = partners_again(1);
    nodes[0]->rounds().judged(faulty, first - 1, "partner 1: its distance exceeds the bound");
    CHECK(nodes[0]->rounds().quarantined().empty());
    nodes[0]->rounds().judged(faulty, first - 1, "partner 1: its distance exceeds the bound");
    const auto score = nodes[0]->rounds().score_of(faulty);
    REQUIRE(score);
    CHECK(score->refused == 2);
    CHECK(score->quarantined_until == first + 8);
    const uint64_t again = partners_again(first + 8);
    for (uint64_t round = first; round <= again; ++round) {
        INFO("round " << round << ", quarantined until " << first + 8);
        const auto partners = choose_partners(nodes, round);
        require_mutual(nodes, partners);
        if (round < first + 8) {
            CHECK(partners[0] != faulty);
        } else if (round == again) {
            CHECK(partners[0] == faulty);
        }
    }
}

TEST_CASE("Pair from an unauthenticated caller, a non-member or another model is refused") {
    LocalCluster cluster(2);
    const auto nodes = wait_for_one_view(cluster);
    const NodeIdentity identity = NodeIdentity::generate();
    const auto stub = v1::Peer::NewStub(swarm_channel(cluster.node(1).address()));
    SwarmAuth auth(cluster.base().swarm_secret, identity);
    v1::PairRequest request;
    request.set_round(1);
    request.set_nonce(1);
    request.set_mode(v1::PAIR_MODE_RANDOM);
    v1::PairResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 2s);

    SECTION("no credentials") {
        CHECK(stub->Pair(&context, request, &response).error_code() ==
              grpc::StatusCode::UNAUTHENTICATED);
    }
    SECTION("the swarm secret, but not a member") {
        auth.attach(context, "Pair");
        const auto status = stub->Pair(&context, request, &response);
        CHECK(status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
        CHECK_THAT(status.error_message(), Catch::Contains("not a member"));
    }
    SECTION("a member running another model") {
        Member stranger;
        stranger.node_id = identity.node_id();
        stranger.address = "127.0.0.1:9";
        stranger.incarnation = 1;
        stranger.fingerprint = "another model";
        stranger.swarm_id = cluster.base().swarm_id;
        stranger.public_key = identity.public_key();
        stranger.instance = 1;
        v1::GossipRequest gossip;
        to_digest(stranger, gossip.add_members());
        v1::GossipResponse gossip_response;
        grpc::ClientContext gossip_context;
        auth.attach(gossip_context, "Gossip");
        REQUIRE(stub->Gossip(&gossip_context, gossip, &gossip_response).ok());
        REQUIRE(state_seen(cluster.node(1), identity.node_id()) == MemberState::Alive);
        auth.attach(context, "Pair");
        const auto status = stub->Pair(&context, request, &response);
        CHECK(status.error_code() == grpc::StatusCode::PERMISSION_DENIED);
        CHECK_THAT(status.error_message(), Catch::Contains("another model"));
    }
    // The refused caller took nothing: the two members still pair with each other.
    CHECK(require_mutual(nodes, choose_partners(nodes, 1)) == 0);
}

TEST_CASE("a private node takes a proposal only on a path both can take") {
    Member self, proposer;
    self.node_id = 1;
    proposer.node_id = 2;
    self.reachability = Reachability::Private;
    self.anchors = {7};
    // From a public member, direct (it waits for this node's stream): taken.
    proposer.reachability = Reachability::Public;
    CHECK(path_refusal(self, proposer, 0, false).empty());
    // From a private member: only through one of this node's anchors, named as the relay.
    proposer.reachability = Reachability::Private;
    CHECK(path_refusal(self, proposer, 7, true).empty());
    CHECK_THAT(path_refusal(self, proposer, 0, false), Catch::Contains("names no anchor"));
    CHECK_THAT(path_refusal(self, proposer, 9, false), Catch::Contains("names no anchor"));
    // A public node takes a proposal from anyone: the proposer's stream can reach it.
    self.reachability = Reachability::Public;
    CHECK(path_refusal(self, proposer, 0, false).empty());
}

TEST_CASE("a proposal to a private member names a relay unless the proposer knows it is public") {
    Member self, target;
    self.node_id = 1;
    target.node_id = 2;
    target.reachability = Reachability::Private;
    target.anchors = {7};
    // The proposer's verdict pending: it may be private too, so the anchor is named as the relay
    // (both would otherwise find no path once both verdicts said private), and the target, which
    // reads the proposer as it may, takes it through its own anchor.
    CHECK(proposes_relay(self, target));
    CHECK(path_refusal(target, self, 7, true).empty());
    self.reachability = Reachability::Private;
    CHECK(proposes_relay(self, target));
    // A public proposer waits for the private member's stream: no relay.
    self.reachability = Reachability::Public;
    CHECK_FALSE(proposes_relay(self, target));
    // A target members can dial, or whose verdict is pending, is called at its address.
    for (const Reachability mine : {Reachability::Unknown, Reachability::Private}) {
        self.reachability = mine;
        target.reachability = Reachability::Public;
        CHECK_FALSE(proposes_relay(self, target));
        target.reachability = Reachability::Unknown;
        CHECK_FALSE(proposes_relay(self, target));
    }
}

TEST_CASE("a node members cannot dial opens its exchanges, proposed to only through its anchors") {
    Member low, high;
    low.node_id = 1;
    high.node_id = 2;
    // Both reachable, or neither known yet: the lower id opens, as before reachability was known.
    CHECK(opens_exchange(low, high));
    CHECK_FALSE(opens_exchange(high, low));
    high.reachability = Reachability::Public;
    CHECK(opens_exchange(low, high));
    CHECK_FALSE(opens_exchange(high, low));
    // The private side dials whichever its id.
    low.reachability = Reachability::Public;
    high.reachability = Reachability::Private;
    CHECK(opens_exchange(high, low));
    CHECK_FALSE(opens_exchange(low, high));
    CHECK_FALSE(callable(high));
    CHECK(callable(low));
    CHECK(can_propose_to(low));
    CHECK_FALSE(can_propose_to(high));  // no anchors named yet
    high.anchors = {7};
    CHECK(can_propose_to(high));
    CHECK_FALSE(needs_relay(low, high));
    CHECK_FALSE(needs_relay(high, low));
    // Both private: neither can reach the other, so they exchange through a relay; the rule
    // stays symmetric (the lower id opens).
    low.reachability = Reachability::Private;
    CHECK(opens_exchange(low, high));
    CHECK_FALSE(opens_exchange(high, low));
    CHECK(needs_relay(low, high));
    CHECK(needs_relay(high, low));
    CHECK_FALSE(can_propose_to(low));  // proposed to through its anchors: none named yet
    low.anchors = {8};
    CHECK(can_propose_to(low));
    Member unknown;
    CHECK(callable(unknown));
}
