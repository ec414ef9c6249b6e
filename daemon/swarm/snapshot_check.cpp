#include "daemon/swarm/snapshot_check.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "common/error.h"
#include "daemon/swarm/swarm_snapshot.h"
#include "optimizer/sanity.h"

namespace starling {

std::optional<std::string> refuse_offered_snapshot(const SnapshotOffer& offer,
                                                   std::span<const SnapshotOffer> offers,
                                                   double own_phi_norm) {
    const std::optional<double> norm = stated_phi_norm(offer.manifest.metadata);
    if (!norm) return "its metadata states no norm of phi (another layout, or an older starlingd)";
    std::vector<double> votes = {own_phi_norm};
    for (const SnapshotOffer& other : offers) {
        if (const std::optional<double> stated = stated_phi_norm(other.manifest.metadata))
            votes.insert(votes.end(), other.donors.size(), *stated);
    }
    if (const auto far = far_from_median(*norm, votes, kFarFactor))
        return "phi's " + *far + " (every donor's stated norm and this node's own)";
    return std::nullopt;
}

std::optional<std::string> refuse_fetched_snapshot(const SnapshotOffer& offer,
                                                   std::span<const std::byte> bytes,
                                                   size_t params) {
    const std::optional<double> stated = stated_phi_norm(offer.manifest.metadata);
    if (!stated) return "its metadata states no norm of phi";
    // Unpacked aside: unpacking checks that every value is finite and AdamW's v non-negative.
    std::vector<float> phi(params), momentum(params), adamw_m(params), adamw_v(params);
    try {
        unpack_swarm_snapshot(bytes, {phi, momentum, adamw_m, adamw_v});
    } catch (const Error& e) {
        return e.what();
    }
    const double norm = euclidean_distance(phi, {});
    if (!(std::abs(norm - *stated) <= kStatedNormTolerance * std::abs(*stated))) {
        char text[160];
        std::snprintf(text, sizeof text,
                      "inconsistent: its phi's norm is %.9g, its manifest states %.9g", norm,
                      *stated);
        return text;
    }
    return std::nullopt;
}

}  // namespace starling
