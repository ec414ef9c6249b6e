// The configuration of one experiment run: N replicas of a model trained in one process, joined by
// a simulated exchange that carries real codec messages (docs/spec.md section 8).
// One TOML file holds the engine sections of a training config ([model], [train], [optimizer],
// [data], [eval]) plus [experiment], [outer], [exchange] and [churn]; see configs/experiments/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/config_keys.h"
#include "experiment/fault.h"

namespace starling {

// Replicas leave and come back (docs/spec.md section 6 and run R6): up-times are exponential with
// the given mean, down-times fixed, both in inner steps and rounded up to whole rounds. A returning
// replica copies a live sponsor's snapshot and takes a new node id (so a new data order).
struct ChurnConfig {
    bool enabled = false;
    double mean_up_steps = 300.0;
    int64_t down_steps = 100;
    uint64_t seed = 1;
};

// How long a round is when replicas train at different speeds (docs/uneven.md).
enum class RoundBudget : uint8_t {
    Steps,   // every replica takes inner_steps steps: the faster ones wait for the slowest
    Tokens,  // the replicas take replicas x inner_steps batches in all, in shares by speed
};
std::string_view round_budget_name(RoundBudget budget);  // "steps", "tokens"
RoundBudget round_budget_from_name(std::string_view name);

// The engine's part (EngineConfig): train.steps is the inner steps each replica takes and must be
// a whole number of rounds of inner_steps; train.seed seeds the initialisation and the node ids.
struct ExperimentConfig : EngineConfig {
    int replicas = 8;
    int group_size = 2;  // NoLoCo
    int eval_every = 1;  // rounds between evaluations of every replica's phi
    // Overlapped rounds (NoLoCo, DiLoCo): the outer step of round r lands this many inner steps
    // into round r+1, as if its exchange ran beside them (docs/overlap.md); 0: sequential rounds,
    // inner_steps: an exchange that takes a whole inner phase.
    int overlap_steps = 0;
    // Uneven machines (docs/uneven.md): replica i trains speeds[i] times as fast as a replica of
    // speed 1 (empty: all 1). Speeds set the simulated clock (sim_time in the CSVs, in the time
    // one step takes at speed 1) and, with round_budget tokens, each replica's share of a round.
    std::vector<double> speeds;
    RoundBudget round_budget = RoundBudget::Steps;
    bool token_weighting = true;  // weigh members' values in the outer step by tokens trained
    ChurnConfig churn;
    FaultConfig fault;  // faulty members, for the study of robust rounds (experiment/fault.h)
    std::string out_dir = "out/experiments";
    std::string name = "run";  // the CSV is <out_dir>/<name>.csv

    int64_t rounds() const { return train.steps / inner_steps; }
    double speed(int replica) const { return speeds.empty() ? 1.0 : speeds[size_t(replica)]; }
    void validate() const;  // throws starling::Error naming the key
};

ExperimentConfig load_experiment_config(const std::string& path);
// Every key such a file holds, with its range, help and value in `config` (by default, the
// defaults) (engine/config_keys.h).
std::vector<KeyDescription> experiment_config_keys(ExperimentConfig config = {});

}  // namespace starling
