// The check of a state copy before it is adopted (daemon/swarm/snapshot_check.h), on hand-computed
// norms: phi = {3, 4} has norm 5.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "daemon/swarm/snapshot_check.h"
#include "daemon/swarm/swarm_snapshot.h"

using namespace starling;

namespace {

// An offer whose metadata states the norm of `phi`, held by `donors`.
SnapshotOffer offer_of(const std::vector<float>& phi, std::vector<std::string> donors) {
    SnapshotOffer offer;
    offer.manifest.metadata = swarm_snapshot_metadata(phi);
    offer.donors = std::move(donors);
    return offer;
}

// One stating `norm` (as a float).
SnapshotOffer offer_stating(double norm, std::vector<std::string> donors) {
    return offer_of({static_cast<float>(norm)}, std::move(donors));
}

// The snapshot bytes of phi and `rest` as momentum, AdamW m and v.
std::vector<std::byte> snapshot_of(const std::vector<float>& phi, const std::vector<float>& rest) {
    return pack_swarm_snapshot({3, 24, 24}, phi, rest, rest, rest);
}

}  // namespace

TEST_CASE("a snapshot's metadata states the norm of its phi, to the last bit") {
    const std::vector<float> phi = {3.0f, 4.0f};
    REQUIRE(stated_phi_norm(swarm_snapshot_metadata(phi)) == 5.0);
    const std::vector<float> odd = {0.1f, 1e-7f, 3e5f};
    const double norm = std::sqrt(double{0.1f} * double{0.1f} + double{1e-7f} * double{1e-7f} +
                                  double{3e5f} * double{3e5f});
    CHECK(stated_phi_norm(swarm_snapshot_metadata(odd)) == norm);
    CHECK_FALSE(stated_phi_norm("swarm-node v1"));  // before the norm was stated
    CHECK_FALSE(stated_phi_norm("swarm-node v2 phi-norm 5 and more"));
    CHECK_FALSE(stated_phi_norm("swarm-node v2 phi-norm "));
}

TEST_CASE("an offer far from the median of the donors' norms and this node's own is refused") {
    // Votes: this node 4, the honest offer 5 held by two donors, 6, and a poisoned 5e11. Their
    // lower median is 5, so anything within 0.5 .. 50 passes.
    const std::vector<SnapshotOffer> offers = {offer_stating(5.0, {"honest-1", "honest-2"}),
                                               offer_stating(6.0, {"near"}),
                                               offer_stating(5e11, {"poisoned"})};
    for (size_t i = 0; i < 2; i++) CHECK_FALSE(refuse_offered_snapshot(offers[i], offers, 4.0));
    const auto far = refuse_offered_snapshot(offers[2], offers, 4.0);
    REQUIRE(far);
    CHECK_THAT(*far, Catch::Contains("phi's norm 5e+11") && Catch::Contains("factor of 10") &&
                         Catch::Contains("median 5 of 5 norms"));

    // The bounds: 50 and 0.5 are within a factor of 10 of 5, just past them is not.
    for (const double norm : {50.0, 0.5})
        CHECK_FALSE(refuse_offered_snapshot(offer_stating(norm, {"x"}), offers, 4.0));
    for (const double norm : {50.01, 0.499})
        CHECK(refuse_offered_snapshot(offer_stating(norm, {"x"}), offers, 4.0));
}

TEST_CASE("with one honest and one poisoned donor, the joiner's own weights decide") {
    const std::vector<SnapshotOffer> offers = {offer_stating(5.0, {"honest"}),
                                               offer_stating(5e11, {"poisoned"})};
    // Votes 4, 5, 5e11: the median is 5.
    CHECK_FALSE(refuse_offered_snapshot(offers[0], offers, 4.0));
    CHECK(refuse_offered_snapshot(offers[1], offers, 4.0));
    // A joiner whose own phi is not finite has no vote. Two donors 1e11 apart are then both far
    // from their geometric mean (1.6e6): nothing is copied, rather than a guess.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    CHECK(refuse_offered_snapshot(offers[0], offers, nan));
    CHECK(refuse_offered_snapshot(offers[1], offers, nan));
}

TEST_CASE("a lone donor may be far from a fresh node's initialisation, within factor squared") {
    // A swarm whose weights grew 30 times past the initialisation (norm 20 to 600): the geometric
    // mean of 20 and 600 is 110, and 600 is within 10 of it.
    const std::vector<SnapshotOffer> lone = {offer_stating(600.0, {"grown"})};
    CHECK_FALSE(refuse_offered_snapshot(lone[0], lone, 20.0));
    const std::vector<SnapshotOffer> poisoned = {offer_stating(2e11, {"poisoned"})};
    CHECK(refuse_offered_snapshot(poisoned[0], poisoned, 20.0));
}

TEST_CASE("an offer stating a norm that is not finite, or none, is refused") {
    const SnapshotOffer nan_offer =
        offer_stating(std::numeric_limits<double>::quiet_NaN(), {"nan"});
    const std::vector<SnapshotOffer> offers = {offer_stating(5.0, {"honest"}), nan_offer};
    const auto not_finite = refuse_offered_snapshot(nan_offer, offers, 4.0);
    REQUIRE(not_finite);
    CHECK_THAT(*not_finite, Catch::Contains("not finite"));
    CHECK_FALSE(refuse_offered_snapshot(offers[0], offers, 4.0));  // NaN is no vote

    SnapshotOffer old = offer_stating(5.0, {"old"});
    old.manifest.metadata = "swarm-node v1";
    const auto none = refuse_offered_snapshot(old, offers, 4.0);
    REQUIRE(none);
    CHECK_THAT(*none, Catch::Contains("states no norm"));
}

TEST_CASE("fetched bytes are refused unless finite and of the norm their offer stated") {
    const std::vector<float> phi = {3.0f, 4.0f}, rest = {0.5f, 0.25f};
    const SnapshotOffer honest = offer_stating(5.0, {"donor"});
    CHECK_FALSE(refuse_fetched_snapshot(honest, snapshot_of(phi, rest), 2));

    // Bytes ten times what the manifest stated: the claim was a lie, or the bytes are another's.
    const auto inconsistent = refuse_fetched_snapshot(honest, snapshot_of({30.0f, 40.0f}, rest), 2);
    REQUIRE(inconsistent);
    CHECK_THAT(*inconsistent, Catch::Contains("inconsistent") && Catch::Contains("norm is 50") &&
                                  Catch::Contains("states 5"));
    // Stated norms 1.6e-7 off (4 + 1e-6 in phi) pass the tolerance; 1.6e-5 off do not.
    CHECK_FALSE(
        refuse_fetched_snapshot(offer_of({3.0f, 4.000001f}, {"donor"}), snapshot_of(phi, rest), 2));
    CHECK(refuse_fetched_snapshot(offer_of({3.0f, 4.0001f}, {"donor"}), snapshot_of(phi, rest), 2));

    // Every arena must be finite, not phi alone, and AdamW's v non-negative.
    const std::vector<float> with_inf = {0.0f, std::numeric_limits<float>::infinity()};
    const std::vector<float> negative = {0.5f, -1.0f};
    const auto momentum_inf = refuse_fetched_snapshot(
        honest, pack_swarm_snapshot({3, 24, 24}, phi, with_inf, rest, rest), 2);
    REQUIRE(momentum_inf);
    CHECK_THAT(*momentum_inf, Catch::Contains("outer momentum[1]"));
    const auto negative_v = refuse_fetched_snapshot(
        honest, pack_swarm_snapshot({3, 24, 24}, phi, rest, rest, negative), 2);
    REQUIRE(negative_v);
    CHECK_THAT(*negative_v, Catch::Contains("AdamW v[1]"));
    // And of this model's size.
    CHECK(refuse_fetched_snapshot(honest, snapshot_of(phi, rest), 3));
}
