// The run configuration: one TOML file (see configs/), with command-line flags layered on top.
// Every option has a default that works on a laptop.
#pragma once

#include <cstdint>
#include <string>

#include "model/config.h"
#include "optimizer/adamw.h"
#include "optimizer/schedule.h"

namespace starling {

struct DataConfig {
    std::string dir = "out/kjv";   // holds train_*.bin and val_*.bin from `starling data prepare`
    std::string tokenizer;         // the tokenizer.json the shards were made with; empty: bytes
    uint64_t node_id = 0;          // seeds this node's order through the data
    uint32_t partition_index = 0;  // disjoint subsets for replicas of one experiment
    uint32_t partition_count = 1;
};

struct TrainConfig {
    ModelConfig model;
    int batch_size = 8;
    int seq_len = 0;  // 0: the model's context
    int64_t steps = 1000;
    uint64_t seed = 1;
    int threads = 0;              // 0: all cores
    std::string device = "auto";  // "auto", "cpu", "cuda", "cuda:N", "cuda:N,M,..." or "cuda:all"
                                  // (kernels/backend.h)
    std::string matmul = "fp32";  // on a GPU: "fp32", "tf32" or "bf16" (kernels/cuda/cuda_ops.h)
    LrSchedule schedule;          // total_steps is taken from steps, see lr_schedule()
    AdamWConfig adamw;
    DataConfig data;
    int log_every = 50;
    int eval_every = 250;  // 0: only at the end
    int eval_batches = 16;
    std::string run_dir = "out/runs/default";
    int checkpoint_every = 0;  // 0: only at the end
    int keep_checkpoints = 3;
    bool resume = true;  // continue from the newest checkpoint in run_dir when there is one

    int effective_seq_len() const { return seq_len > 0 ? seq_len : model.context; }
    LrSchedule lr_schedule() const {
        LrSchedule s = schedule;
        s.total_steps = steps;
        return s;
    }
    // Throws starling::Error naming the key. Reads [data].tokenizer when set, which must fit the
    // model: [model].vocab_size at least its vocabulary.
    void validate() const;
};

// Reads and validates a TOML config. Unknown sections or keys are errors (a typo must not
// silently fall back to a default). Errors name the file and the key.
TrainConfig load_train_config(const std::string& path);

}  // namespace starling
