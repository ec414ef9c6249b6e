#include "daemon/swarm/swarm_snapshot.h"

#include <bit>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.h"
#include "optimizer/sanity.h"

namespace starling {

static_assert(std::endian::native == std::endian::little, "the snapshot layout is little-endian");

namespace {

constexpr const char* kMetadataPrefix = "swarm-node v2 phi-norm ";

void put_u64(std::byte* at, uint64_t value) { std::memcpy(at, &value, sizeof value); }

uint64_t get_u64(const std::byte* at) {
    uint64_t value = 0;
    std::memcpy(&value, at, sizeof value);
    return value;
}

void check_arena(std::span<const float> values, const char* name, bool non_negative) {
    for (size_t i = 0; i < values.size(); i++) {
        if (!std::isfinite(values[i]) || (non_negative && values[i] < 0.0f)) {
            throw Error(std::string("swarm snapshot: ") + name + "[" + std::to_string(i) + "] is " +
                        std::to_string(values[i]));
        }
    }
}

}  // namespace

size_t swarm_snapshot_bytes(size_t params) {
    return kSwarmSnapshotHeaderBytes + 4 * params * sizeof(float);
}

void pack_swarm_snapshot_into(std::span<std::byte> out, const SwarmCounters& counters,
                              std::span<const float> phi, std::span<const float> momentum,
                              std::span<const float> adamw_m, std::span<const float> adamw_v) {
    const size_t n = phi.size();
    if (momentum.size() != n || adamw_m.size() != n || adamw_v.size() != n)
        throw Error("swarm snapshot: the arenas differ in size");
    if (out.size() != swarm_snapshot_bytes(n))
        throw Error("swarm snapshot: the output is not the snapshot's size");
    put_u64(out.data(), counters.round);
    put_u64(out.data() + 8, counters.inner_step);
    put_u64(out.data() + 16, counters.adamw_steps);
    put_u64(out.data() + 24, n);
    std::byte* at = out.data() + kSwarmSnapshotHeaderBytes;
    for (std::span<const float> arena : {phi, momentum, adamw_m, adamw_v}) {
        std::memcpy(at, arena.data(), arena.size_bytes());
        at += arena.size_bytes();
    }
}

std::vector<std::byte> pack_swarm_snapshot(const SwarmCounters& counters,
                                           std::span<const float> phi,
                                           std::span<const float> momentum,
                                           std::span<const float> adamw_m,
                                           std::span<const float> adamw_v) {
    std::vector<std::byte> bytes(swarm_snapshot_bytes(phi.size()));
    pack_swarm_snapshot_into(bytes, counters, phi, momentum, adamw_m, adamw_v);
    return bytes;
}

std::string swarm_snapshot_metadata(std::span<const float> phi) {
    char text[64];
    std::snprintf(text, sizeof text, "%s%.17g", kMetadataPrefix, euclidean_distance(phi, {}));
    return text;
}

std::optional<double> stated_phi_norm(std::string_view metadata) {
    if (!metadata.starts_with(kMetadataPrefix)) return std::nullopt;
    const std::string_view number = metadata.substr(std::strlen(kMetadataPrefix));
    double norm = 0.0;
    const auto [end, error] = std::from_chars(number.data(), number.data() + number.size(), norm);
    if (error != std::errc() || end != number.data() + number.size()) return std::nullopt;
    return norm;
}

SwarmCounters unpack_swarm_snapshot(std::span<const std::byte> bytes, const SwarmArenas& out) {
    const size_t n = out.phi.size();
    if (bytes.size() != swarm_snapshot_bytes(n)) {
        throw Error("swarm snapshot: " + std::to_string(bytes.size()) +
                    " bytes, but this model needs " + std::to_string(swarm_snapshot_bytes(n)));
    }
    if (get_u64(bytes.data() + 24) != n) {
        throw Error("swarm snapshot: it holds " + std::to_string(get_u64(bytes.data() + 24)) +
                    " parameters, this model has " + std::to_string(n));
    }
    SwarmCounters counters{get_u64(bytes.data()), get_u64(bytes.data() + 8),
                           get_u64(bytes.data() + 16)};
    const std::byte* at = bytes.data() + kSwarmSnapshotHeaderBytes;
    for (std::span<float> arena : {out.phi, out.momentum, out.adamw_m, out.adamw_v}) {
        if (arena.size() != n) throw Error("swarm snapshot: the arenas differ in size");
        std::memcpy(arena.data(), at, arena.size_bytes());
        at += arena.size_bytes();
    }
    check_arena(out.phi, "phi", false);
    check_arena(out.momentum, "outer momentum", false);
    check_arena(out.adamw_m, "AdamW m", false);
    check_arena(out.adamw_v, "AdamW v", true);
    return counters;
}

}  // namespace starling
