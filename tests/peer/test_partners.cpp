// Partner matching (peer/partners.h), against the properties docs/spec.md section 4 asks of it.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "common/error.h"
#include "peer/partners.h"

using namespace starling;

namespace {

using Groups = std::vector<std::vector<uint64_t>>;

// n distinct ids spread over the whole 64-bit range, as real node ids are.
std::vector<uint64_t> node_ids(size_t n, uint64_t seed) {
    std::mt19937_64 gen(seed);
    std::set<uint64_t> ids;
    while (ids.size() < n) ids.insert(gen());
    return std::vector<uint64_t>(ids.begin(), ids.end());
}

std::vector<uint64_t> shuffled(std::vector<uint64_t> ids, uint64_t seed) {
    std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
    return ids;
}

}  // namespace

TEST_CASE("groups hold every id once, in pairs with one single left over for an odd count") {
    for (size_t n = 1; n <= 17; n++) {
        const std::vector<uint64_t> ids = node_ids(n, n);
        for (uint64_t round : {uint64_t{0}, uint64_t{1}, uint64_t{123456789}}) {
            CAPTURE(n, round);
            const Groups groups = deterministic_groups(round, ids, 2);
            std::vector<uint64_t> seen;
            size_t singles = 0;
            for (const auto& g : groups) {
                REQUIRE((g.size() == 1 || g.size() == 2));
                singles += g.size() == 1;
                CHECK(std::is_sorted(g.begin(), g.end()));
                seen.insert(seen.end(), g.begin(), g.end());
            }
            std::sort(seen.begin(), seen.end());
            CHECK(seen == ids);
            CHECK(singles == n % 2);
            CHECK(groups.size() == (n + 1) / 2);
        }
    }
    // Larger groups: 8 ids in threes are two groups of 3 and one of 2.
    std::multiset<size_t> sizes;
    for (const auto& g : deterministic_groups(5, node_ids(8, 1), 3)) sizes.insert(g.size());
    CHECK(sizes == std::multiset<size_t>{2, 3, 3});
}

TEST_CASE("groups depend on the set of ids, not on the order they are listed in") {
    const std::vector<uint64_t> ids = node_ids(9, 2);
    for (uint64_t round = 0; round < 10; round++) {
        const Groups expected = deterministic_groups(round, ids, 2);
        for (uint64_t s = 0; s < 3; s++) {
            CHECK(deterministic_groups(round, shuffled(ids, 10 * round + s), 2) == expected);
        }
    }
    CHECK(membership_digest(shuffled(ids, 7)) == membership_digest(ids));
    std::vector<uint64_t> other = ids;
    other.back() ^= 1;
    CHECK(membership_digest(other) != membership_digest(ids));
}

TEST_CASE("pairings change from round to round") {
    const std::vector<uint64_t> ids = node_ids(8, 3);
    std::set<Groups> distinct;
    for (uint64_t round = 0; round < 20; round++) {
        distinct.insert(deterministic_groups(round, ids, 2));
    }
    // 105 ways to pair 8 ids: 20 independent draws give about 18 distinct pairings.
    CHECK(distinct.size() >= 15);
}

TEST_CASE("a different membership gives different groups") {
    // ids 1..8 against 1..7 and 9: 9 sorts where 8 did, so a seed that ignored the membership
    // would pair the first seven ids identically in both views.
    const std::vector<uint64_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
    const std::vector<uint64_t> b = {1, 2, 3, 4, 5, 6, 7, 9};
    int differing = 0;
    for (uint64_t round = 0; round < 10; round++) {
        Groups renamed = deterministic_groups(round, b, 2);
        for (auto& g : renamed) std::replace(g.begin(), g.end(), uint64_t{9}, uint64_t{8});
        differing += renamed != deterministic_groups(round, a, 2);
    }
    CHECK(differing >= 8);
}

TEST_CASE("over many rounds every id pairs with every other about equally often") {
    // 8 ids, 2000 rounds: each of the 28 pairs is expected 2000 / 7 = 285.7 times, with a
    // standard deviation of about 15.6; 20% is 3.6 deviations.
    const std::vector<uint64_t> ids = node_ids(8, 4);
    const int rounds = 2000;
    std::map<std::pair<uint64_t, uint64_t>, int> count;
    for (uint64_t round = 0; round < rounds; round++) {
        for (const auto& g : deterministic_groups(round, ids, 2)) count[{g[0], g[1]}]++;
    }
    CHECK(count.size() == 28);
    const double expected = rounds / 7.0;
    for (const auto& [pair, c] : count) {
        CAPTURE(pair.first, pair.second, c);
        CHECK(std::fabs(c - expected) < 0.2 * expected);
    }
}

TEST_CASE("matching refuses a repeated id and groups smaller than two") {
    CHECK_THROWS_AS(deterministic_groups(0, std::vector<uint64_t>{1, 2, 3, 2}, 2), Error);
    CHECK_THROWS_AS(membership_digest(std::vector<uint64_t>{5, 5}), Error);
    CHECK_THROWS_AS(deterministic_groups(0, std::vector<uint64_t>{1, 2, 3}, 1), Error);
    CHECK_THROWS_AS(deterministic_groups(0, std::vector<uint64_t>{1, 2, 3}, 0), Error);
}
