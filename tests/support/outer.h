// Shared by the outer-step tests.
#pragma once

#include <span>
#include <vector>

#include "optimizer/outer.h"

namespace starling::test {

// group_mean of whole vectors (at least one), summed in the order given.
inline std::vector<float> mean_of(const std::vector<std::vector<float>>& members) {
    const std::vector<std::span<const float>> spans(members.begin(), members.end());
    std::vector<float> out(members.front().size());
    group_mean(out, spans);
    return out;
}

}  // namespace starling::test
