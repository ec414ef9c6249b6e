// `starling data prepare`: text -> tokens -> train and validation shards in one directory.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace starling {

// The name of the tokenizer file in a prepared directory.
inline constexpr const char* kDataTokenizerFile = "tokenizer.json";

struct PrepareOptions {
    std::string out_dir;               // created if missing
    std::string tokenizer;             // a tokenizer.json (tokenizer.h); empty: bytes
    double val_fraction = 0.05;        // the last val_fraction of the tokens, in (0, 0.5]
    size_t shard_tokens = 10'000'000;  // at most this many tokens per shard
};

struct PrepareResult {
    int vocab_size = 0;  // the tokenizer's
    size_t total_tokens = 0;
    size_t train_tokens = 0;
    size_t val_tokens = 0;
    std::vector<std::string> train_paths;  // out_dir/train_000000.bin, ...
    std::vector<std::string> val_paths;    // out_dir/val_000000.bin, ...
    size_t removed_stale = 0;              // old train_*/val_*.bin files removed from out_dir
};

// Tokenizes text with options.tokenizer and holds out the last round(val_fraction * tokens)
// tokens as the validation split. Each split is cut into ceil(n / shard_tokens) shards of nearly
// equal size (they differ by at most one token), so no shard is a short remainder. Shards are
// written atomically; afterwards any other train_*.bin or val_*.bin in out_dir (left over from an
// earlier run with more shards) is removed so the directory holds exactly this dataset. The
// directory names its vocabulary: a tokenizer file is copied in as out_dir/tokenizer.json, and
// with bytes an old tokenizer.json is removed.
// Throws Error for val_fraction outside (0, 0.5], shard_tokens of 0 or above the int32 limit, an
// empty out_dir, a bad tokenizer file, or text too short to give each split at least 2 tokens.
PrepareResult prepare_shards(const std::string& text, const PrepareOptions& options);

// Throws Error when the shards in data_dir were not prepared with the tokenizer at
// tokenizer_path (empty: bytes), judged by data_dir/tokenizer.json: it must hold the same text as
// that file, and must be absent for bytes. Catches a model that would read tokens of another
// vocabulary (for a byte model, ids past its embedding).
void check_shards_tokenizer(const std::string& data_dir, const std::string& tokenizer_path);

}  // namespace starling
