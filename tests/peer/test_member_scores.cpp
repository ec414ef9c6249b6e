// The quarantine rule against counts and rounds worked out by hand from the policy: a refusal adds
// 2 strikes (at most 4), an accepted message takes 1 off, 4 strikes quarantine a member for 8
// rounds (two refusals in a row, or three in five alternating messages), each quarantine after
// that is twice the last (capped), and after a quarantine one refusal with no accepted message
// between starts the next.
#include <catch2/catch.hpp>

#include "peer/member_scores.h"

using namespace starling;

TEST_CASE("one refusal does not quarantine a member; two in a row do, for 8 rounds", "[peer]") {
    MemberScores scores;
    CHECK_FALSE(scores.refused(7, 10, "too far"));
    CHECK_FALSE(scores.quarantined(7, 11));
    const auto q = scores.refused(7, 11, "not finite");
    REQUIRE(q);
    CHECK(q->member == 7);
    CHECK(q->rounds == 8);
    CHECK(q->until_round == 20);  // rounds 12..19 skipped, paired again from 20
    CHECK(q->score.refused == 2);
    CHECK(q->score.refused_lately == 2);
    CHECK(q->score.judged_lately == 2);
    CHECK(q->score.strikes == 2);  // what a quarantine leaves: one refusal's
    CHECK(q->score.quarantines == 1);
    CHECK(q->score.last_refusal == "not finite");
    CHECK(scores.quarantined(7, 12));
    CHECK(scores.quarantined(7, 19));
    CHECK_FALSE(scores.quarantined(7, 20));
    CHECK_FALSE(scores.quarantined(8, 12));  // another member
    CHECK(scores.quarantined_in(15) == std::vector<uint64_t>{7});
    CHECK(scores.quarantined_in(20).empty());
}

TEST_CASE("a member refused one message in three is never quarantined", "[peer]") {
    MemberScores scores;
    // Strikes: 2, 1, 0 each time round.
    for (uint64_t round = 0; round < 30; round += 3) {
        CHECK_FALSE(scores.refused(3, round, "too far"));
        scores.accepted(3);
        scores.accepted(3);
    }
    const auto score = scores.score(3);
    REQUIRE(score);
    CHECK(score->refused == 10);
    CHECK(score->accepted == 20);
    CHECK(score->strikes == 0);
    CHECK(score->refused_lately == 0);
    CHECK(score->judged_lately == 0);
    CHECK(score->quarantines == 0);
    CHECK_FALSE(scores.score(4));
}

TEST_CASE("a member refused every other message is quarantined at its third refusal", "[peer]") {
    MemberScores scores;
    // Strikes: 2, 1, 3, 2, then 4.
    CHECK_FALSE(scores.refused(9, 0, "a round old"));
    scores.accepted(9);
    CHECK_FALSE(scores.refused(9, 2, "a round old"));
    scores.accepted(9);
    const auto q = scores.refused(9, 4, "a round old");
    REQUIRE(q);
    CHECK(q->until_round == 13);
    CHECK(q->score.refused_lately == 3);
    CHECK(q->score.judged_lately == 5);
    CHECK(q->score.refused == 3);
    CHECK(q->score.accepted == 2);
}

TEST_CASE("refusals during a quarantine add no time and at most the strikes of a quarantine",
          "[peer]") {
    MemberScores scores;
    scores.refused(6, 0, "a");
    REQUIRE(scores.refused(6, 1, "b"));  // quarantined to round 10, 2 strikes left
    // A DiLoCo D is judged every round, quarantined or not: 4 strikes at most.
    for (uint64_t round = 2; round < 10; round++) CHECK_FALSE(scores.refused(6, round, "c"));
    CHECK(scores.score(6)->strikes == 4);
    CHECK(scores.score(6)->quarantined_until == 10);
    for (int i = 0; i < 4; i++) scores.accepted(6);
    CHECK(scores.score(6)->strikes == 0);
    CHECK_FALSE(scores.refused(6, 20, "d"));  // one refusal after four accepted messages
}

TEST_CASE("after a quarantine one refusal starts the next, twice as long, up to the cap",
          "[peer]") {
    MemberScores scores(QuarantinePolicy{2, 4, 8, 40});
    scores.refused(5, 0, "a");
    REQUIRE(scores.refused(5, 1, "b")->until_round == 10);  // 8 rounds
    // A message of a round paired before the quarantine began adds no time.
    CHECK_FALSE(scores.refused(5, 2, "c"));
    CHECK(scores.score(5)->quarantined_until == 10);
    const auto second = scores.refused(5, 10, "d");
    REQUIRE(second);
    CHECK(second->rounds == 16);
    CHECK(second->until_round == 27);
    const auto third = scores.refused(5, 27, "e");
    REQUIRE(third);
    CHECK(third->rounds == 32);
    const auto capped = scores.refused(5, 60, "f");
    REQUIRE(capped);
    CHECK(capped->rounds == 40);
    CHECK(capped->score.quarantines == 4);
    // An accepted message between: strikes 2, 1, then 3 and 4, so two refusals in a row again, and
    // the length goes on from the quarantines so far.
    scores.accepted(5);
    CHECK_FALSE(scores.refused(5, 101, "g"));
    CHECK(scores.refused(5, 102, "h")->rounds == 40);
}
