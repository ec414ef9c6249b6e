// Learning-rate schedule: linear warmup to max_lr, then cosine decay to a floor.
#pragma once

#include <cstdint>

namespace starling {

struct LrSchedule {
    float max_lr = 3e-3f;
    int64_t warmup_steps = 0;
    int64_t total_steps = 1;
    float min_lr_fraction = 0.1f;  // the floor is max_lr * min_lr_fraction

    // step counts from 0: step 0 of a 10-step warmup uses max_lr / 10; from total_steps on,
    // the floor.
    float lr_at(int64_t step) const;
    void validate() const;  // throws starling::Error naming the field
};

}  // namespace starling
