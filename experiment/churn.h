// When replicas leave and come back (run R6): up-times drawn from an exponential distribution,
// fixed down-times, both rounded up to whole rounds; a counter-based RNG makes the schedule a pure
// function of the seed. The last live replica never leaves, so the swarm never empties.
#pragma once

#include <cstdint>
#include <vector>

#include "experiment/experiment_config.h"

namespace starling {

class ChurnSchedule {
public:
    ChurnSchedule(const ChurnConfig& config, int replicas, int inner_steps);

    struct Changes {
        std::vector<int> leaving;    // live replicas that go down at this round
        std::vector<int> returning;  // down replicas that come back at this round
    };
    // The changes at the start of `round`, given who is live now (replica index -> live).
    Changes at_round(int64_t round, const std::vector<bool>& live);
    // A sponsor for a returning replica, uniformly among `candidates` (not empty).
    int pick_sponsor(const std::vector<int>& candidates);

private:
    int64_t draw_up_rounds();
    uint64_t next_random();

    ChurnConfig config_;
    int inner_steps_;
    int64_t down_rounds_;
    std::vector<int64_t> next_change_;  // round at which each replica changes state
    uint64_t counter_ = 0;
};

}  // namespace starling
