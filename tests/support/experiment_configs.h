// One node of the swarm experiment's model (configs/experiments/swarm.toml) on the KJV, with a
// short schedule: for tests that follow one replica on another backend or device set.
#pragma once

#include <string>

#include "experiment/experiment_config.h"
#include "tests/support/kjv.h"

namespace starling::test {

inline ExperimentConfig one_node_experiment() {
    ExperimentConfig c = load_experiment_config(std::string(STARLING_SOURCE_DIR) +
                                                "/configs/experiments/swarm.toml");
    c.train.data.dir = kjv_dir();
    c.train.threads = 2;
    c.train.steps = 20;
    c.train.schedule.warmup_steps = 5;
    c.replicas = 1;
    c.inner_steps = 5;
    return c;
}

}  // namespace starling::test
