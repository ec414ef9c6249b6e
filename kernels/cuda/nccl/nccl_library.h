// NCCL, opened with dlopen when the first multi-GPU group is made, like cuBLAS
// (kernels/cuda/cublas_library.cuh): binaries start on machines without it, and only a
// `device = "cuda:0,1,..."` setting needs it.
#pragma once

#include <nccl.h>

namespace starling::cuda {

struct NcclLibrary {
    decltype(&ncclGetVersion) get_version;
    decltype(&ncclCommInitAll) comm_init_all;
    decltype(&ncclCommDestroy) comm_destroy;
    decltype(&ncclAllReduce) all_reduce;
    decltype(&ncclGroupStart) group_start;
    decltype(&ncclGroupEnd) group_end;
    decltype(&ncclGetErrorString) error_string;
    decltype(&ncclGetLastError) last_error;

    // Opens libnccl once per process; throws starling::Error naming the library and what dlopen
    // or dlsym said when it cannot.
    static const NcclLibrary& get();
};

}  // namespace starling::cuda
