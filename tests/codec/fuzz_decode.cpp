// Fuzz target for the message decoder. scripts/fuzz builds this file into a libFuzzer binary; the
// codec test suite compiles it too and replays tests/codec/corpus through fuzz_decode_complete.
//
// Input: one mode byte, then parts, each a little-endian u32 length followed by that many bytes
// (clamped to what is left). The first part is the header, the others are chunks. Mode bit 0
// recomputes the header checksum and bit 1 every chunk checksum before decoding, so mutations get
// past the checksums and reach the deeper checks, zstd and the element decoders.
#include <xxhash.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "common/error.h"
#include "model/manifest.h"
#include "codec/message.h"

namespace {

constexpr size_t kMaxParts = 256;

// A tiny model whose embedding (512 x 8 = 4096 elements) is big enough to take the state codec.
const starling::ParameterManifest& fuzz_manifest() {
    static const starling::ParameterManifest manifest([] {
        starling::ModelConfig c;
        c.n_layer = 1;
        c.d_model = 8;
        c.n_head = 2;
        c.d_ff = 12;
        c.vocab_size = 512;
        return c;
    }());
    return manifest;
}

void put64(uint8_t* p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get64(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
}
uint32_t get32(const uint8_t* p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
           static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

}  // namespace

const starling::ParameterManifest& fuzz_decode_manifest() { return fuzz_manifest(); }

// Decodes one input; true when it carried a complete, valid message. Anything but a
// starling::Error escaping, or a sanitizer report, is a bug.
bool fuzz_decode_complete(const uint8_t* data, size_t size) {
    if (size == 0) return false;
    const uint8_t mode = data[0];
    std::vector<std::vector<uint8_t>> parts;
    size_t pos = 1;
    while (pos < size && parts.size() < kMaxParts) {
        size_t len = 0;
        for (int i = 0; i < 4 && pos < size; i++, pos++)
            len |= static_cast<size_t>(data[pos]) << (8 * i);
        len = std::min(len, size - pos);
        parts.emplace_back(data + pos, data + pos + len);
        pos += len;
    }
    if (parts.empty()) return false;

    using starling::codec::kChunkHeaderBytes;
    using starling::codec::kHeaderBytes;
    std::vector<uint8_t>& header = parts[0];
    if ((mode & 1) && header.size() >= kHeaderBytes) {
        put64(header.data() + 56, XXH3_64bits(header.data(), 56));
    }
    if ((mode & 2) && header.size() >= kHeaderBytes) {
        const uint64_t seed = get64(header.data() + 56);
        for (size_t i = 1; i < parts.size(); i++) {
            std::vector<uint8_t>& c = parts[i];
            if (c.size() < kChunkHeaderBytes) continue;
            const size_t payload =
                std::min<size_t>(get32(c.data() + 24), c.size() - kChunkHeaderBytes);
            const uint64_t h = XXH3_64bits_withSeed(c.data(), 40, seed);
            put64(c.data() + 40, XXH3_64bits_withSeed(c.data() + kChunkHeaderBytes, payload, h));
        }
    }

    const starling::ParameterManifest& manifest = fuzz_manifest();
    static std::vector<float> arena(manifest.total());
    bool complete = false;
    try {
        starling::codec::MessageDecoder decoder(manifest.fingerprint(), manifest, arena.data(),
                                                arena.size());
        for (size_t i = 0; i < parts.size(); i++) {
            const std::span<const std::byte> bytes(
                reinterpret_cast<const std::byte*>(parts[i].data()), parts[i].size());
            try {
                if (i == 0)
                    decoder.accept_header(bytes);
                else
                    decoder.accept_chunk(bytes);
            } catch (const starling::Error&) {
                // Once failed, the decoder must refuse everything.
                if (!decoder.failed()) __builtin_trap();
            }
        }
        complete = decoder.complete() && !decoder.failed();
    } catch (const starling::Error&) {
    }
    return complete;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_decode_complete(data, size);
    return 0;
}
