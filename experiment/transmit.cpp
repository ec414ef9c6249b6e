#include "experiment/transmit.h"

namespace starling {

size_t transmit(const codec::MessagePlan& plan, const codec::RoundingKey& key,
                std::span<const float> source, float* residual, bool zstd,
                const ParameterManifest& manifest, std::span<float> destination) {
    codec::MessageEncoder encoder(plan, key, source.data(), residual, zstd);
    const codec::EncodedMessage message = codec::encode_to_end(encoder);
    codec::MessageDecoder decoder(manifest.fingerprint(), manifest, destination.data(),
                                  destination.size());
    codec::decode_to_end(message.header, message.chunks, decoder);
    return message.bytes();
}

}  // namespace starling
