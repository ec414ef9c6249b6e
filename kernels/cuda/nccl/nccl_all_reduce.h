// The all-reduce among the GPUs of one box, on NCCL: one communicator per device, made together
// by ncclCommInitAll in this process, and one grouped ncclAllReduce (ncclAvg, in place) per call,
// queued on each device's own stream so that the AdamW step queued after it waits for it on the
// device and the host never does. Host code only, built by the C++ compiler where nccl.h is found.
#pragma once

#include <memory>
#include <span>

#include "kernels/all_reduce.h"
#include "kernels/cuda/cuda_ops.h"

namespace starling::cuda {

// Throws starling::Error naming NCCL's complaint when the library is missing or the
// communicators cannot be made.
std::unique_ptr<AllReduce> make_nccl_all_reduce(std::span<CudaOps* const> devices);

// NCCL's version as "2.28.9"; throws starling::Error when the library cannot be opened.
std::string nccl_version();

}  // namespace starling::cuda
