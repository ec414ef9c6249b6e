// Batches of (inputs, targets) from token shards, in a reproducible order that can be resumed.
//
// The dataset (the shards in the given order) is cut into sequences of T+1 tokens at stride T
// within each shard: sequence j of a shard covers tokens [j*T, j*T + T], so its last token is the
// first of the next, and a shard of n tokens gives (n-1)/T sequences (leftover tokens at its end
// are not used; no sequence spans two shards). Sequences are numbered k = 0, 1, ... across the
// shards.
//
// Partitioning: sequence k belongs to partition hash_index(kDatasetSeed, k) % partition_count.
// The hash depends only on k, so every node computes the same disjoint partitions without talking
// to the others. Order: with shuffle, epoch e visits the partition's sequences in a Fisher-Yates
// permutation driven by hash_index(hash_index(node_id, e), i); without shuffle, in increasing k.
// Epochs follow each other seamlessly inside a batch. The position (epoch, index in the epoch) is
// the whole state, so restore() continues with exactly the batches an uninterrupted run would get.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/shard.h"

namespace starling {

// Fixed seed of the partition hash; part of the data format: changing it changes every partition.
inline constexpr uint64_t kDatasetSeed = 0x535441524c494e47ULL;  // "STARLING"

// The partition sequence k belongs to, out of partition_count (>= 1; 0 throws Error).
uint32_t sequence_partition(uint64_t k, uint32_t partition_count);

struct DataLoaderOptions {
    std::vector<std::string> shard_paths;  // in dataset order, e.g. from list_shards()
    int B = 0;                             // sequences per batch
    int T = 0;                             // tokens per sequence (inputs); each reads T+1 tokens
    uint64_t node_id = 0;                  // seeds the shuffle order, not the partitioning
    uint32_t partition_index = 0;          // which disjoint subset this loader reads
    uint32_t partition_count = 1;
    bool shuffle = true;  // false: sequential order (validation)
};

struct LoaderState {
    uint64_t epoch = 0;
    uint64_t position = 0;  // sequences of this epoch already returned, < sequences_per_epoch()
    bool operator==(const LoaderState&) const = default;
};

class DataLoader {
public:
    // Opens and validates every shard. Throws Error for B or T < 1, a bad partition, no shards,
    // a shard shorter than T+1 tokens (named), or a partition with fewer than B sequences.
    explicit DataLoader(DataLoaderOptions options);

    // Fills inputs[B*T] and targets[B*T] (row-major, row b is one sequence): targets[i] is the
    // token after inputs[i].
    void next_batch(int32_t* inputs, int32_t* targets);

    LoaderState state() const { return {epoch_, position_}; }
    // Continues from a state() of a loader with the same shards and options. Throws Error if the
    // position is not inside the epoch (the data, T or the partitioning changed).
    void restore(const LoaderState& saved);
    // Back to epoch 0, position 0.
    void reset();

    uint64_t sequences_per_epoch() const { return members_.size(); }  // in this partition
    uint64_t total_sequences() const { return seq_begin_.back(); }    // in all partitions
    const DataLoaderOptions& options() const { return options_; }

private:
    void build_order();
    std::string describe() const;

    DataLoaderOptions options_;
    std::vector<Shard> shards_;
    std::vector<uint64_t> seq_begin_;  // first sequence number of each shard, plus the total
    std::vector<uint64_t> members_;    // this partition's sequence numbers, increasing
    std::vector<uint64_t> order_;      // this epoch's permutation of members_ (shuffle only)
    uint64_t epoch_ = 0;
    uint64_t position_ = 0;
};

}  // namespace starling
