// The configuration of one experiment run: N replicas of a model trained in one process, joined by
// a simulated exchange that carries real codec messages (docs/spec.md section 8).
// One TOML file holds the engine sections of a training config ([model], [train], [optimizer],
// [data], [eval]) plus [experiment], [outer], [exchange] and [churn]; see configs/experiments/.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "daemon/config.h"
#include "optimizer/codec/codec.h"
#include "optimizer/outer_round.h"

namespace starling {

enum class Method : uint8_t {
    Ddp,     // gradient averaging every step: the reference
    Local,   // no communication at all
    DiLoCo,  // all-gather of delta messages over the live quorum every H steps
    NoLoCo,  // groups of group_size (pairs) every H steps, chosen by deterministic_groups
};
std::string_view method_name(Method method);  // "ddp", "local", "diloco", "noloco"
Method method_from_name(std::string_view name);

struct ExchangeConfig {
    MessageMode mode = MessageMode::Fused;
    codec::Codec state_codec = codec::Codec::BF16SR;  // theta (fused) or phi (split)
    codec::Codec delta_codec = codec::Codec::Q8;      // D (split NoLoCo, DiLoCo)
    bool error_feedback = true;                       // on the delta messages
    bool zstd = true;
};

// Replicas leave and come back (docs/spec.md section 6 and run R6): up-times are exponential with
// the given mean, down-times fixed, both in inner steps and rounded up to whole rounds. A returning
// replica copies a live sponsor's snapshot and takes a new node id (so a new data order).
struct ChurnConfig {
    bool enabled = false;
    double mean_up_steps = 300.0;
    int64_t down_steps = 100;
    uint64_t seed = 1;
};

struct ExperimentConfig {
    // The engine: model, per-replica batch, steps (inner steps each replica takes: the token
    // budget), seed (initialisation, node ids), threads, schedule, AdamW, data.dir, eval_batches.
    TrainConfig train;
    Method method = Method::NoLoCo;
    int replicas = 8;
    int inner_steps = 50;  // H: inner steps per round; train.steps must be a multiple
    int group_size = 2;    // NoLoCo
    int eval_every = 1;    // rounds between evaluations of every replica's phi
    // Overlapped rounds (NoLoCo, DiLoCo): the outer step of round r lands this many inner steps
    // into round r+1, as if its exchange ran beside them (docs/overlap.md); 0: sequential rounds,
    // inner_steps: an exchange that takes a whole inner phase.
    int overlap_steps = 0;
    OuterConfig outer;
    ExchangeConfig exchange;
    ChurnConfig churn;
    std::string out_dir = "out/experiments";
    std::string name = "run";  // the CSV is <out_dir>/<name>.csv

    int64_t rounds() const { return train.steps / inner_steps; }
    void validate() const;  // throws starling::Error naming the key
};

ExperimentConfig load_experiment_config(const std::string& path);

class TableReader;
// The [outer] and [exchange] sections, shared with the daemon's config
// (daemon/swarm/node_config.h).
void read_outer_section(TableReader& reader, OuterConfig& outer);
void read_exchange_section(TableReader& reader, ExchangeConfig& exchange);

}  // namespace starling
