#include "data/tokenizer.h"

#include "common/error.h"

namespace starling {

std::vector<uint16_t> ByteTokenizer::encode(std::string_view text) const {
    std::vector<uint16_t> tokens(text.size());
    for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
    return tokens;
}

std::string ByteTokenizer::decode(std::span<const uint16_t> tokens) const {
    std::string text(tokens.size(), '\0');
    for (size_t i = 0; i < tokens.size(); ++i) {
        if (tokens[i] >= kVocabSize) {
            throw Error("byte tokenizer: token " + std::to_string(tokens[i]) + " at position " +
                        std::to_string(i) + " is outside the vocabulary of " + std::to_string(kVocabSize));
        }
        text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
    }
    return text;
}

}  // namespace starling
