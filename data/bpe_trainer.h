// `starling data train-tokenizer`: learns byte-level BPE merges from text and writes them as a
// Hugging Face tokenizer.json that BpeTokenizer (and Hugging Face's tokenizers) load.
//
// The text is cut into words by GPT-2's pre-tokenizer and each distinct word counted once. Every
// step merges the most frequent adjacent pair of tokens over all words (weighted by the word's
// count); among pairs of equal count the one whose (first, second) byte strings are
// lexicographically smallest, so the result depends on nothing but the text. Pair counts are
// updated only in the words that hold the merged pair, not recounted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace starling {

// The special token at the last id, as in GPT-2.
inline constexpr std::string_view kEndOfText = "<|endoftext|>";

struct TrainedBpe {
    std::vector<std::string> token_bytes;     // id -> bytes; the last is kEndOfText
    std::vector<std::pair<int, int>> merges;  // by rank: the two ids merged
    std::string hf_json;                      // tokenizer.json
};

// vocab_size counts the 256 byte tokens (ids 0-255 in GPT-2's byte order), one token per merge
// and kEndOfText. Stops early, with a smaller vocabulary, when no pair is left to merge.
// Throws Error for vocab_size outside [257, 65536].
TrainedBpe train_bpe(std::string_view text, int vocab_size);

}  // namespace starling
