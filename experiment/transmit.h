// The simulated wire: a message goes through the real codec path, framed and checksummed chunk by
// chunk by the sender and checked and decoded by the receiver, with the bytes counted. Only the
// network is missing.
#pragma once

#include <cstddef>
#include <span>

#include "codec/message.h"

namespace starling {

// Encodes source (plan.numel values; residual, when not null, turns on error feedback) and decodes
// it into destination. Returns the bytes on the wire: header plus framed chunks.
size_t transmit(const codec::MessagePlan& plan, const codec::RoundingKey& key,
                std::span<const float> source, float* residual, bool zstd,
                const ParameterManifest& manifest, std::span<float> destination);

}  // namespace starling
