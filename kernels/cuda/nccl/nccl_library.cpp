#include "kernels/cuda/nccl/nccl_library.h"

#include <string>

#include "kernels/cuda/shared_library.cuh"

namespace starling::cuda {

namespace {

NcclLibrary open_library() {
    // The soname of the NCCL these headers belong to, e.g. libnccl.so.2.
    const SharedLibrary library("libnccl.so." + std::to_string(NCCL_MAJOR));
    NcclLibrary lib{};
    library.bind("ncclGetVersion", lib.get_version);
    library.bind("ncclCommInitAll", lib.comm_init_all);
    library.bind("ncclCommDestroy", lib.comm_destroy);
    library.bind("ncclAllReduce", lib.all_reduce);
    library.bind("ncclGroupStart", lib.group_start);
    library.bind("ncclGroupEnd", lib.group_end);
    library.bind("ncclGetErrorString", lib.error_string);
    library.bind("ncclGetLastError", lib.last_error);
    return lib;
}

}  // namespace

const NcclLibrary& NcclLibrary::get() {
    static const NcclLibrary lib = open_library();
    return lib;
}

}  // namespace starling::cuda
