// `starling data prepare`: text -> byte tokens -> train and validation shards in one directory.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace starling {

struct PrepareOptions {
    std::string out_dir;               // created if missing
    double val_fraction = 0.05;        // the last val_fraction of the tokens, in (0, 0.5]
    size_t shard_tokens = 10'000'000;  // at most this many tokens per shard
};

struct PrepareResult {
    size_t total_tokens = 0;
    size_t train_tokens = 0;
    size_t val_tokens = 0;
    std::vector<std::string> train_paths;  // out_dir/train_000000.bin, ...
    std::vector<std::string> val_paths;    // out_dir/val_000000.bin, ...
    size_t removed_stale = 0;              // old train_*/val_*.bin files removed from out_dir
};

// Tokenizes text with the byte tokenizer and holds out the last round(val_fraction * tokens)
// tokens as the validation split. Each split is cut into ceil(n / shard_tokens) shards of nearly
// equal size (they differ by at most one token), so no shard is a short remainder. Shards are
// written atomically; afterwards any other train_*.bin or val_*.bin in out_dir (left over from an
// earlier run with more shards) is removed so the directory holds exactly this dataset.
// Throws Error for val_fraction outside (0, 0.5], shard_tokens of 0 or above the int32 limit, an
// empty out_dir, or text too short to give each split at least 2 tokens.
PrepareResult prepare_shards(const std::string& text, const PrepareOptions& options);

}  // namespace starling
