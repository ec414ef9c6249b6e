// Byte-level tokenizer: every byte of the UTF-8 (or any) text is one token, vocabulary 256.
// Lossless on arbitrary bytes, needs no training and no vocabulary file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace starling {

class ByteTokenizer {
public:
    static constexpr int kVocabSize = 256;

    int vocab_size() const { return kVocabSize; }
    // One token per byte, the byte's unsigned value.
    std::vector<uint16_t> encode(std::string_view text) const;
    // Inverse of encode. Throws Error for a token >= 256, naming its position.
    std::string decode(std::span<const uint16_t> tokens) const;
};

}  // namespace starling
