#include "data/loader.h"

#include <algorithm>
#include <utility>

#include "common/error.h"
#include "common/random.h"

namespace starling {

uint32_t sequence_partition(uint64_t k, uint32_t partition_count) {
    if (partition_count == 0) throw Error("data loader: partition_count must be at least 1");
    return static_cast<uint32_t>(hash_index(kDatasetSeed, k) % partition_count);
}

DataLoader::DataLoader(DataLoaderOptions options) : options_(std::move(options)) {
    const std::string what = describe();
    if (options_.shard_paths.empty()) throw Error("data loader: no shard paths given");
    if (options_.B < 1 || options_.T < 1) {
        throw Error(what + ": B and T must be positive, got B = " + std::to_string(options_.B) +
                    ", T = " + std::to_string(options_.T));
    }
    if (options_.partition_count < 1 || options_.partition_index >= options_.partition_count) {
        throw Error(what + ": partition index " + std::to_string(options_.partition_index) +
                    " is not in [0, " + std::to_string(options_.partition_count) + ")");
    }

    const uint64_t T = uint64_t(options_.T);
    shards_.reserve(options_.shard_paths.size());
    seq_begin_.push_back(0);
    for (const std::string& path : options_.shard_paths) {
        Shard shard(path);
        if (shard.size() < T + 1) {
            throw Error(path + ": shard too short: " + std::to_string(shard.size()) +
                        " tokens, a sequence needs T+1 = " + std::to_string(T + 1));
        }
        seq_begin_.push_back(seq_begin_.back() + (shard.size() - 1) / T);
        shards_.push_back(std::move(shard));
    }

    const uint64_t total = seq_begin_.back();
    if (options_.partition_count == 1) {
        members_.resize(total);
        for (uint64_t k = 0; k < total; ++k) members_[k] = k;
    } else {
        for (uint64_t k = 0; k < total; ++k) {
            if (sequence_partition(k, options_.partition_count) == options_.partition_index)
                members_.push_back(k);
        }
    }
    if (members_.size() < uint64_t(options_.B)) {
        throw Error(
            what + ": partition " + std::to_string(options_.partition_index) + " of " +
            std::to_string(options_.partition_count) + " holds " + std::to_string(members_.size()) +
            " sequences of T+1 = " + std::to_string(T + 1) + " tokens (of " +
            std::to_string(total) + " in all), fewer than B = " + std::to_string(options_.B));
    }
    build_order();
}

std::string DataLoader::describe() const {
    const auto& paths = options_.shard_paths;
    if (paths.empty()) return "data loader";
    std::string s = "data loader over " + paths.front();
    if (paths.size() > 1) s += " and " + std::to_string(paths.size() - 1) + " more shards";
    return s;
}

void DataLoader::build_order() {
    if (!options_.shuffle) {
        order_.clear();
        return;
    }
    order_ = members_;
    const uint64_t seed = hash_index(options_.node_id, epoch_);
    for (uint64_t i = order_.size() - 1; i > 0; --i) {
        // Modulo bias is at most (i+1) / 2^64: negligible, and the result is fully specified.
        const uint64_t j = hash_index(seed, i) % (i + 1);
        std::swap(order_[i], order_[j]);
    }
}

void DataLoader::next_batch(int32_t* inputs, int32_t* targets) {
    const size_t B = size_t(options_.B);
    const size_t T = size_t(options_.T);
    const uint64_t n = members_.size();
    for (size_t b = 0; b < B; ++b) {
        const uint64_t k = options_.shuffle ? order_[position_] : members_[position_];
        const size_t s =
            size_t(std::upper_bound(seq_begin_.begin(), seq_begin_.end(), k) - seq_begin_.begin()) -
            1;
        const uint16_t* src = shards_[s].tokens().data() + (k - seq_begin_[s]) * T;
        int32_t* in = inputs + b * T;
        int32_t* tg = targets + b * T;
        for (size_t t = 0; t < T; ++t) {
            in[t] = int32_t(src[t]);
            tg[t] = int32_t(src[t + 1]);
        }
        if (++position_ == n) {
            ++epoch_;
            position_ = 0;
            build_order();
        }
    }
}

void DataLoader::restore(const LoaderState& saved) {
    if (saved.position >= members_.size()) {
        throw Error(
            describe() + ": cannot restore position " + std::to_string(saved.position) +
            " of epoch " + std::to_string(saved.epoch) + ": an epoch of this partition has only " +
            std::to_string(members_.size()) +
            " sequences (did the shards, T or the partitioning change since the state was saved?)");
    }
    epoch_ = saved.epoch;
    position_ = saved.position;
    build_order();
}

void DataLoader::reset() { restore(LoaderState{}); }

}  // namespace starling
