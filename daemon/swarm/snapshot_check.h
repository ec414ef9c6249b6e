// What a joiner checks of a state copy before adopting it (peer/state_sync.h's judges). Matching
// hashes prove the bytes are the donor's, not that the donor's state is any good: a member that
// diverged (a learning rate mistyped 1e2) publishes weights of norm 1e11, or NaN, and a joiner
// that copied them would report NaN from its first evaluation. So, with the same tests the
// faulty-member check of partners' messages uses (optimizer/sanity.h):
// - before any chunk is fetched, an offer whose stated norm of phi (its manifest's metadata,
//   daemon/swarm/swarm_snapshot.h) is more than kFarFactor from the median of the votes, above or
//   below, is refused (far_from_median: the median on a log scale). The votes are every answering
//   donor's stated norm and the joiner's own phi's, so with one honest and one poisoned donor the
//   poisoned one is still the outlier. It is a majority rule all the same: where most votes are
//   far, the honest minority is what gets refused. Norms rather than distances between offers: a
//   donor states its norm in a few bytes, while a distance needs every offer's bytes before one
//   is chosen. Honest replicas trained alike have norms close to each other; a
//   fresh joiner's initialisation may be several times smaller (pico: 18.9 at the start, 82
//   after 3,200 steps) but is one vote, and beside a lone donor the log-scale median lets the
//   two be 100 times apart. A diverged run is many orders of magnitude off within a round.
// - once fetched, every value must be finite (AdamW's v non-negative) and phi's norm must be the
//   one stated, within kStatedNormTolerance: a donor whose bytes are not what it stated is refused
//   as inconsistent, so a liar cannot pass the first test with a modest claim.
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "peer/state_sync.h"

namespace starling {

inline constexpr double kFarFactor = 10.0;
// Relative. Donor and joiner compute the norm alike (in double, in index order), so an honest
// donor matches to the last bit; the tolerance only forgives another compiler's rounding.
inline constexpr double kStatedNormTolerance = 1e-6;

// Why `offer` is refused before fetching it, beside every offer made and the norm of this node's
// own phi (euclidean_distance, optimizer/sanity.h; not a vote unless finite); empty to fetch it.
std::optional<std::string> refuse_offered_snapshot(const SnapshotOffer& offer,
                                                   std::span<const SnapshotOffer> offers,
                                                   double own_phi_norm);

// Why the fetched bytes of `offer` are refused for a model of `params` parameters; empty to adopt
// them.
std::optional<std::string> refuse_fetched_snapshot(const SnapshotOffer& offer,
                                                   std::span<const std::byte> bytes, size_t params);

}  // namespace starling
