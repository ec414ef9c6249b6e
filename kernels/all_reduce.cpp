#include "kernels/all_reduce.h"

#include <cstdint>

namespace starling {

void HostAllReduce::average(std::span<float* const> arrays, size_t n) {
    if (arrays.size() < 2) return;
    const float inverse_count = 1.0f / static_cast<float>(arrays.size());
    const auto count = static_cast<int64_t>(n);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; i++) {
        float total = 0.0f;
        for (float* array : arrays) total += array[i];
        const float mean = total * inverse_count;
        for (float* array : arrays) array[i] = mean;
    }
}

}  // namespace starling
