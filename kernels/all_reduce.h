// The gradient all-reduce of data parallelism among the devices of one box: one float array per
// device, averaged in place, so every array ends holding the element-wise mean of all of them.
// NCCL does it among GPUs (kernels/cuda/nccl/nccl_all_reduce.h); HostAllReduce among backends whose
// arenas are host memory, where it also serves as the reference the GPU path is checked against.
#pragma once

#include <cstddef>
#include <span>

namespace starling {

class AllReduce {
public:
    virtual ~AllReduce() = default;
    // arrays[r] is device r's array of n floats. Work may still be in flight on the devices'
    // streams when this returns; what each device runs next on its stream sees the mean.
    virtual void average(std::span<float* const> arrays, size_t n) = 0;
};

// Sums in device order, element by element, then divides by the count: the same bits whatever
// the thread count, and the same bits in every array.
class HostAllReduce final : public AllReduce {
public:
    void average(std::span<float* const> arrays, size_t n) override;
};

}  // namespace starling
