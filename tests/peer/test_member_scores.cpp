// The quarantine rule against counts and rounds worked out by hand from the policy: two refusals in
// a row quarantine a member for 8 rounds, each quarantine after that is twice the last (capped),
// and after a quarantine one refusal with no accepted message between starts the next.
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
    CHECK(q->score.in_a_row == 2);
    CHECK(q->score.quarantines == 1);
    CHECK(q->score.last_refusal == "not finite");
    CHECK(scores.quarantined(7, 12));
    CHECK(scores.quarantined(7, 19));
    CHECK_FALSE(scores.quarantined(7, 20));
    CHECK_FALSE(scores.quarantined(8, 12));  // another member
    CHECK(scores.quarantined_in(15) == std::vector<uint64_t>{7});
    CHECK(scores.quarantined_in(20).empty());
}

TEST_CASE("an accepted message between two refusals quarantines no one", "[peer]") {
    MemberScores scores;
    for (uint64_t round = 0; round < 20; round += 2) {
        CHECK_FALSE(scores.refused(3, round, "too far"));
        scores.accepted(3);
    }
    const auto score = scores.score(3);
    REQUIRE(score);
    CHECK(score->refused == 10);
    CHECK(score->accepted == 10);
    CHECK(score->in_a_row == 0);
    CHECK(score->quarantines == 0);
    CHECK_FALSE(scores.score(4));
}

TEST_CASE("after a quarantine one refusal starts the next, twice as long, up to the cap",
          "[peer]") {
    MemberScores scores(QuarantinePolicy{2, 8, 40});
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
    // An accepted message ends the run: two refusals in a row again, and the length goes on from
    // the quarantines so far.
    scores.accepted(5);
    CHECK_FALSE(scores.refused(5, 101, "g"));
    CHECK(scores.refused(5, 102, "h")->rounds == 40);
}
