// An experiment run (docs/spec.md section 8): config.replicas replicas stepped in
// lockstep in one process, each on its own disjoint partition of the training data, joined every
// H inner steps by the method's outer step over a simulated exchange that carries real codec
// messages. Writes <out_dir>/<name>.csv (a row per replica per evaluated round) and appends a line
// to <out_dir>/summary.csv; the columns are documented in experiment/README.md.
#pragma once

#include <cstdint>
#include <string>

#include "experiment/experiment_config.h"

namespace starling {

struct ExperimentSummary {
    std::string name;
    OuterMethod method = OuterMethod::NoLoCo;
    size_t params = 0;
    int64_t rounds = 0;
    uint64_t tokens = 0;           // trained by all replicas together
    double final_loss_mean = 0.0;  // validation loss of each live replica's phi, at the end
    double final_loss_min = 0.0;
    double final_loss_max = 0.0;
    double averaged_phi_loss = 0.0;  // validation loss of the mean of the live replicas' phi
    double final_spread = 0.0;       // sigma_w at the end
    double sent_per_round = 0.0;     // bytes a live replica sent per round, on average
    double received_per_round = 0.0;
    uint64_t paired = 0;   // replica-rounds that averaged with at least one partner
    uint64_t solo = 0;     // replica-rounds that stepped alone
    uint64_t refused = 0;  // partner messages refused by the sanity check
    uint64_t rejoins = 0;
    double seconds = 0.0;
    double sim_time = 0.0;  // simulated time of the whole run, in steps at speed 1 (speeds)
    // With faulty members ([fault]): the honest replicas' final loss, and how the outer steps
    // judged the messages of faulty and honest members (NoLoCo's partners; every other member's D
    // in DiLoCo).
    double honest_loss_mean = 0.0;
    uint64_t poisoned_judged = 0, poisoned_refused = 0;
    uint64_t honest_judged = 0, honest_refused = 0;
    int64_t first_quarantine_round = -1;  // an honest member first quarantined a faulty one
};

ExperimentSummary run_experiment(const ExperimentConfig& config);

}  // namespace starling
