#include "data/byte_level.h"

#include <unordered_map>

namespace starling {

namespace {

bool stands_for_itself(int byte) {
    return (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) ||
           (byte >= 0xAE && byte <= 0xFF);
}

struct Alphabet {
    std::array<std::string, 256> characters;
    std::array<uint8_t, 256> order{};
    std::unordered_map<uint32_t, uint8_t> byte_of_code_point;

    Alphabet() {
        int next_id = 0;
        for (int b = 0; b < 256; b++)
            if (stands_for_itself(b)) order[size_t(next_id++)] = uint8_t(b);
        uint32_t next_extra = 0x100;
        for (int b = 0; b < 256; b++) {
            uint32_t code_point = uint32_t(b);
            if (!stands_for_itself(b)) {
                code_point = next_extra++;
                order[size_t(next_id++)] = uint8_t(b);
            }
            // Every code point here is below U+0800: one or two UTF-8 bytes.
            std::string& utf8 = characters[size_t(b)];
            if (code_point < 0x80) {
                utf8 += char(code_point);
            } else {
                utf8 += char(0xC0 | (code_point >> 6));
                utf8 += char(0x80 | (code_point & 0x3F));
            }
            byte_of_code_point[code_point] = uint8_t(b);
        }
    }
};

const Alphabet& alphabet() {
    static const Alphabet instance;
    return instance;
}

}  // namespace

std::string_view byte_level_char(uint8_t byte) { return alphabet().characters[byte]; }

const std::array<uint8_t, 256>& gpt2_byte_order() { return alphabet().order; }

std::optional<std::string> byte_level_decode(std::string_view characters) {
    const Alphabet& a = alphabet();
    std::string bytes;
    size_t i = 0;
    while (i < characters.size()) {
        const auto lead = uint8_t(characters[i]);
        uint32_t code_point = lead;
        if (lead >= 0xC0 && lead < 0xE0 && i + 1 < characters.size() &&
            (uint8_t(characters[i + 1]) & 0xC0) == 0x80) {
            code_point = ((lead & 0x1Fu) << 6) | (uint8_t(characters[i + 1]) & 0x3Fu);
            if (code_point < 0x80) return std::nullopt;  // an overlong encoding is not UTF-8
            i += 2;
        } else if (lead < 0x80) {
            i += 1;
        } else {
            return std::nullopt;  // a longer or broken sequence: outside the alphabet either way
        }
        const auto it = a.byte_of_code_point.find(code_point);
        if (it == a.byte_of_code_point.end()) return std::nullopt;
        bytes += char(it->second);
    }
    return bytes;
}

std::string byte_level_bpe_json(const nlohmann::ordered_json& vocab,
                                const nlohmann::ordered_json& merges,
                                const nlohmann::ordered_json& added_tokens, bool split_words) {
    const nlohmann::ordered_json byte_level = {{"type", "ByteLevel"},
                                               {"add_prefix_space", false},
                                               {"trim_offsets", split_words},
                                               {"use_regex", split_words}};
    const nlohmann::ordered_json json = {
        {"version", "1.0"},
        {"truncation", nullptr},
        {"padding", nullptr},
        {"added_tokens", added_tokens},
        {"normalizer", nullptr},
        {"pre_tokenizer", byte_level},
        {"post_processor", nullptr},
        {"decoder", byte_level},
        {"model",
         {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"vocab", vocab},
          {"merges", merges}}},
    };
    return json.dump(2) + "\n";
}

}  // namespace starling
