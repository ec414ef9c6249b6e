#include "experiment/transmit.h"

#include <vector>

#include "common/error.h"

namespace starling {

size_t transmit(const codec::MessagePlan& plan, const codec::RoundingKey& key,
                std::span<const float> source, float* residual, bool zstd,
                const ParameterManifest& manifest, std::span<float> destination) {
    codec::MessageEncoder encoder(plan, key, source.data(), residual, zstd);
    codec::MessageDecoder decoder(manifest.fingerprint(), manifest, destination.data(),
                                  destination.size());
    size_t bytes = encoder.header_bytes().size();
    decoder.accept_header(encoder.header_bytes());
    std::vector<std::byte> chunk;
    while (encoder.next_chunk(chunk)) {
        bytes += chunk.size();
        decoder.accept_chunk(chunk);
    }
    if (!decoder.complete()) throw Error("simulated exchange: the message ended early");
    return bytes;
}

}  // namespace starling
