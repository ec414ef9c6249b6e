// The bytes a swarm node publishes for joiners (peer/state_sync.h carries them) and loads when it
// joins: everything its next round depends on besides the data order, which is the joiner's own.
//
// Layout, little-endian, n = the model's parameter count:
//   offset 0   u64 round        the round the state starts (the donor's next one)
//   offset 8   u64 inner_step   inner steps taken: the learning-rate schedule's position
//   offset 16  u64 adamw_steps  AdamW's step count (its bias correction)
//   offset 24  u64 n            checked against the joiner's model
//   offset 32  f32 phi[n], f32 outer_momentum[n], f32 adamw_m[n], f32 adamw_v[n]
// so 32 + 16 n bytes. Theta is not sent (it equals phi at a round's start) and neither is the
// error-feedback residual (a joiner starts it at zero, docs/spec.md section 6). The manifest's
// metadata states the L2 norm of phi, by which a joiner weighs offers before fetching one
// (daemon/swarm/snapshot_check.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace starling {

inline constexpr size_t kSwarmSnapshotHeaderBytes = 32;

struct SwarmCounters {
    uint64_t round = 0;
    uint64_t inner_step = 0;
    uint64_t adamw_steps = 0;
};

// The arenas of a snapshot, each n floats.
struct SwarmArenas {
    std::span<float> phi, momentum, adamw_m, adamw_v;
};

size_t swarm_snapshot_bytes(size_t params);

// Packs into `out`, which must hold swarm_snapshot_bytes(n) bytes.
void pack_swarm_snapshot_into(std::span<std::byte> out, const SwarmCounters& counters,
                              std::span<const float> phi, std::span<const float> momentum,
                              std::span<const float> adamw_m, std::span<const float> adamw_v);
std::vector<std::byte> pack_swarm_snapshot(const SwarmCounters& counters,
                                           std::span<const float> phi,
                                           std::span<const float> momentum,
                                           std::span<const float> adamw_m,
                                           std::span<const float> adamw_v);

// The metadata a snapshot is published with: "swarm-node v2 phi-norm " and euclidean_distance(phi)
// (optimizer/sanity.h) in as many digits as give back the same double.
std::string swarm_snapshot_metadata(std::span<const float> phi);
// The norm of phi that a snapshot's metadata states; empty when it states none (another layout,
// or a donor of a version before the norm was stated).
std::optional<double> stated_phi_norm(std::string_view metadata);

// Copies a snapshot into the arenas and returns its counters. The bytes come from other nodes, so
// a wrong size or parameter count, a non-finite value or a negative second moment throws
// starling::Error naming it, and the arenas must then be discarded.
SwarmCounters unpack_swarm_snapshot(std::span<const std::byte> bytes, const SwarmArenas& out);

}  // namespace starling
