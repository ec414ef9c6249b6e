// GPT-2's byte-level alphabet: every byte stands for one visible Unicode character, so byte-level
// BPE vocabularies (GPT-2's, Hugging Face's ByteLevel) can spell any byte string as text.
// Printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for themselves; the other 68
// take U+0100 onwards in byte order (space is 'Ġ' U+0120, newline 'Ċ' U+010A).
#pragma once

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace starling {

// The UTF-8 of the character that stands for byte.
std::string_view byte_level_char(uint8_t byte);

// The bytes in GPT-2's vocabulary order: its token i is the single byte gpt2_byte_order()[i]
// (the printable bytes first, in byte order, then the other 68), so "!" is 0 and " " is 220.
const std::array<uint8_t, 256>& gpt2_byte_order();

// The bytes a string of byte-level characters stands for; nullopt when it holds a character
// outside the alphabet (or is not UTF-8).
std::optional<std::string> byte_level_decode(std::string_view characters);

// A byte-level BPE tokenizer.json as Hugging Face's tokenizers writes one: vocab (characters ->
// id), merges ("a b" strings), added_tokens (its array of objects), and whether GPT-2's expression
// cuts the text into words before the merges (use_regex, with trim_offsets alike).
std::string byte_level_bpe_json(const nlohmann::ordered_json& vocab,
                                const nlohmann::ordered_json& merges,
                                const nlohmann::ordered_json& added_tokens, bool split_words);

}  // namespace starling
