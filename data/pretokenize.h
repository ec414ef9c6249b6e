// GPT-2's pre-tokenization: text cut into the words BPE merges within, by GPT-2's regular
// expression (the one Hugging Face's ByteLevel pre-tokenizer uses):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// through PCRE2 in UTF mode with Unicode properties. Bytes that are not UTF-8 match nothing; each
// run of them between matches is a word of its own, so every byte of any input lands in exactly
// one word and the words concatenate back to the input.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace starling {

class Gpt2PreTokenizer {
public:
    Gpt2PreTokenizer();  // compiles the expression (with PCRE2's JIT where it has one)
    ~Gpt2PreTokenizer();
    Gpt2PreTokenizer(const Gpt2PreTokenizer&) = delete;
    Gpt2PreTokenizer& operator=(const Gpt2PreTokenizer&) = delete;

    // Calls word(piece) for each word of text in order; the pieces point into text.
    // Safe to call from several threads at once.
    void for_each_word(std::string_view text,
                       const std::function<void(std::string_view)>& word) const;
    std::vector<std::string> split(std::string_view text) const;

private:
    struct Compiled;
    std::unique_ptr<Compiled> compiled_;
};

}  // namespace starling
