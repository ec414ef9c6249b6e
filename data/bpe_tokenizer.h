// Byte-level BPE as GPT-2 and Hugging Face's tokenizers define it, read from a tokenizer.json:
// added tokens (such as <|endoftext|>) are cut out of the text verbatim first, the rest is cut
// into words by GPT-2's expression (pretokenize.h), each word's bytes become byte-level
// characters and are merged by rank, the lowest-ranked pair first, until no merge applies.
//
// Accepted files: model.type "BPE" with a vocab (token -> id, ids below 65536 since shards hold
// uint16) that holds all 256 byte characters, merges as "a b" strings or ["a", "b"] pairs whose
// parts and results are all in the vocab; pre_tokenizer ByteLevel without a prefix space
// (use_regex true, GPT-2's split, or false, no split); decoder ByteLevel; no normalizer; no
// dropout, subword prefix or suffix, byte fallback or ignore_merges; added tokens without
// lstrip, rstrip or single_word. The post_processor is not read: encoding adds no tokens.
#pragma once

#include <array>
#include <memory>
#include <unordered_map>

#include "data/pretokenize.h"
#include "data/tokenizer.h"

namespace starling {

class BpeTokenizer : public Tokenizer {
public:
    // Parses tokenizer.json text; errors name `source` and the problem.
    static BpeTokenizer parse(const std::string& json_text, const std::string& source);
    // Reads and parses the file at path (kept as path()).
    static BpeTokenizer read(const std::string& path);

    int vocab_size() const override { return vocab_size_; }
    std::vector<uint16_t> encode(std::string_view text) const override;
    std::string decode(std::span<const uint16_t> tokens) const override;
    std::string hf_json() const override { return json_text_; }  // the file as it was read
    const std::string& path() const override { return source_; }
    std::string describe() const override;
    bool fits(int model_vocab_size) const override {
        return model_vocab_size >= vocab_size_ && model_vocab_size - vocab_size_ <= kMaxPaddingRows;
    }

    size_t merge_count() const { return merge_count_; }

private:
    struct Merge {
        uint32_t rank;
        uint16_t result;
    };
    static uint32_t pair_key(uint16_t first, uint16_t second) {
        return uint32_t(first) << 16 | second;
    }

    void encode_ordinary(std::string_view text, std::vector<uint16_t>& out,
                         std::unordered_map<std::string, std::vector<uint16_t>>& cache) const;
    void encode_word(std::string_view word, std::vector<uint16_t>& out) const;

    std::string source_;
    std::string json_text_;
    int vocab_size_ = 0;
    size_t merge_count_ = 0;
    std::array<uint16_t, 256> byte_token_{};
    std::unordered_map<uint32_t, Merge> merges_;             // by pair_key
    std::vector<std::string> token_bytes_;                   // id -> the bytes it decodes to
    std::vector<bool> is_token_;                             // id -> whether any token has it
    std::vector<std::pair<std::string, uint16_t>> added_;    // content, id
    std::shared_ptr<const Gpt2PreTokenizer> pre_tokenizer_;  // null: use_regex false, no split
};

}  // namespace starling
