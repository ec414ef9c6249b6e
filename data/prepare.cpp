#include "data/prepare.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>
#include <span>
#include <system_error>

#include "common/atomic_file.h"
#include "common/error.h"
#include "data/corpus.h"
#include "data/shard.h"
#include "data/tokenizer.h"

namespace starling {

namespace fs = std::filesystem;

namespace {

// The fewest tokens a split may have: one input and its target.
constexpr size_t kMinSplitTokens = 2;

std::vector<std::string> write_split(const fs::path& dir, const std::string& split,
                                     std::span<const uint16_t> tokens, size_t shard_tokens) {
    const size_t shards = (tokens.size() + shard_tokens - 1) / shard_tokens;
    const size_t base = tokens.size() / shards;
    const size_t extra = tokens.size() % shards;  // the first `extra` shards get one more token
    std::vector<std::string> paths;
    size_t offset = 0;
    for (size_t i = 0; i < shards; ++i) {
        const size_t n = base + (i < extra ? 1 : 0);
        std::string path = (dir / shard_file_name(split, i)).string();
        write_shard(path, tokens.subspan(offset, n));
        paths.push_back(std::move(path));
        offset += n;
    }
    return paths;
}

// Removes <split>_*.bin files in dir that are not in keep.
size_t remove_stale(const fs::path& dir, const std::string& split,
                    const std::vector<std::string>& keep) {
    std::set<std::string> kept;
    for (const std::string& path : keep) kept.insert(fs::path(path).filename().string());
    const std::string prefix = split + "_";
    std::vector<fs::path> stale;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!name.starts_with(prefix) || !name.ends_with(".bin")) continue;
        std::error_code type_ec;
        if (!it->is_regular_file(type_ec)) continue;
        if (kept.count(name) == 0) stale.push_back(it->path());
    }
    if (ec) throw Error(dir.string() + ": cannot list the output directory: " + ec.message());
    for (const fs::path& p : stale) {
        if (!fs::remove(p, ec) && ec)
            throw Error(p.string() + ": cannot remove stale shard: " + ec.message());
    }
    return stale.size();
}

// The shards' vocabulary goes with them: the tokenizer file, or for bytes none (an old file would
// name another vocabulary).
void write_or_remove_tokenizer(const fs::path& path, const Tokenizer& tokenizer) {
    if (!tokenizer.path().empty()) return write_file_atomic(path, tokenizer.hf_json());
    std::error_code ec;
    if (!fs::remove(path, ec) && ec)
        throw Error(path.string() + ": cannot remove the old tokenizer: " + ec.message());
}

}  // namespace

PrepareResult prepare_shards(const std::string& text, const PrepareOptions& options) {
    if (options.out_dir.empty()) throw Error("data prepare: the output directory is empty");
    if (!(options.val_fraction > 0.0 && options.val_fraction <= 0.5)) {
        throw Error("data prepare: val_fraction " + std::to_string(options.val_fraction) +
                    " is outside (0, 0.5]");
    }
    if (options.shard_tokens == 0) throw Error("data prepare: shard_tokens must be positive");
    if (options.shard_tokens > size_t(std::numeric_limits<int32_t>::max())) {
        throw Error("data prepare: shard_tokens " + std::to_string(options.shard_tokens) +
                    " exceeds the int32 token count of a shard header");
    }

    const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer);
    const std::vector<uint16_t> tokens = tokenizer->encode(text);
    const size_t total = tokens.size();
    const size_t val = static_cast<size_t>(std::llround(options.val_fraction * double(total)));
    const size_t train = total - val;  // val <= total / 2 + 1, so no underflow
    if (val < kMinSplitTokens || train < kMinSplitTokens) {
        throw Error("data prepare: text too short: " + std::to_string(total) + " tokens give " +
                    std::to_string(train) + " training and " + std::to_string(val) +
                    " validation tokens at val_fraction " + std::to_string(options.val_fraction) +
                    "; each split needs at least " + std::to_string(kMinSplitTokens));
    }

    const fs::path dir(options.out_dir);
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error(options.out_dir + ": cannot create the output directory: " + ec.message());
    if (!fs::is_directory(dir)) throw Error(options.out_dir + ": not a directory");

    const std::span<const uint16_t> all(tokens);
    PrepareResult result;
    result.vocab_size = tokenizer->vocab_size();
    result.total_tokens = total;
    result.train_tokens = train;
    result.val_tokens = val;
    result.train_paths = write_split(dir, "train", all.first(train), options.shard_tokens);
    result.val_paths = write_split(dir, "val", all.subspan(train), options.shard_tokens);
    result.removed_stale =
        remove_stale(dir, "train", result.train_paths) + remove_stale(dir, "val", result.val_paths);
    write_or_remove_tokenizer(dir / kDataTokenizerFile, *tokenizer);
    return result;
}

void check_shards_tokenizer(const std::string& data_dir, const std::string& tokenizer_path) {
    const fs::path in_dir = fs::path(data_dir) / kDataTokenizerFile;
    std::error_code ec;
    const bool present = fs::exists(in_dir, ec);
    if (tokenizer_path.empty()) {
        if (present)
            throw Error(
                data_dir + ": the shards were prepared with " + in_dir.string() +
                ", but [data].tokenizer is empty (bytes): set it to that file, or prepare the shards again "
                "without --tokenizer");
        return;
    }
    if (!present)
        throw Error(data_dir + ": no " + kDataTokenizerFile +
                    " (the shards, if any, were prepared with bytes), but "
                    "[data].tokenizer is " +
                    tokenizer_path + ": run starling data prepare --tokenizer " + tokenizer_path +
                    " --out " + data_dir);
    if (read_text_file(in_dir.string()) != read_text_file(tokenizer_path))
        throw Error(data_dir + ": the shards were prepared with another tokenizer: " +
                    in_dir.string() + " differs from [data].tokenizer " + tokenizer_path);
}

}  // namespace starling
