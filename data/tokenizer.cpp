#include "data/tokenizer.h"

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/bpe_tokenizer.h"
#include "data/byte_level.h"

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
                        std::to_string(i) + " is outside the vocabulary of " +
                        std::to_string(kVocabSize));
        }
        text[i] = static_cast<char>(static_cast<unsigned char>(tokens[i]));
    }
    return text;
}

std::string ByteTokenizer::hf_json() const {
    nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
    for (int b = 0; b < kVocabSize; b++) vocab[std::string(byte_level_char(uint8_t(b)))] = b;
    // No word splitting: without merges the words change nothing.
    return byte_level_bpe_json(vocab, nlohmann::ordered_json::array(),
                               nlohmann::ordered_json::array(), false);
}

const std::string& ByteTokenizer::path() const {
    static const std::string none;
    return none;
}

std::string ByteTokenizer::describe() const {
    return "bytes (" + std::to_string(kVocabSize) + " tokens)";
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
    if (path.empty()) return std::make_unique<ByteTokenizer>();
    return std::make_unique<BpeTokenizer>(BpeTokenizer::read(path));
}

}  // namespace starling
