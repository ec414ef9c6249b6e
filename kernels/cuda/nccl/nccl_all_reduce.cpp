#include "kernels/cuda/nccl/nccl_all_reduce.h"

#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/nccl/nccl_library.h"

namespace starling::cuda {

namespace {

void check(const NcclLibrary& nccl, ncclResult_t status, const char* call, ncclComm_t comm) {
    if (status == ncclSuccess) return;
    std::string message = std::string(call) + " failed: " + nccl.error_string(status);
    const char* detail = nccl.last_error(comm);
    if (detail != nullptr && *detail != '\0') message += " (" + std::string(detail) + ")";
    throw Error(message);
}

class NcclAllReduce final : public AllReduce {
public:
    explicit NcclAllReduce(std::span<CudaOps* const> devices) : nccl_(NcclLibrary::get()) {
        std::vector<int> indices;
        for (CudaOps* device : devices) {
            indices.push_back(device->device().index);
            streams_.push_back(device->stream());
        }
        comms_.resize(indices.size());
        check(nccl_,
              nccl_.comm_init_all(comms_.data(), static_cast<int>(indices.size()), indices.data()),
              "ncclCommInitAll", nullptr);
    }

    ~NcclAllReduce() override {
        for (ncclComm_t comm : comms_) (void)nccl_.comm_destroy(comm);
    }

    void average(std::span<float* const> arrays, size_t n) override {
        if (arrays.size() != comms_.size()) {
            throw Error("NCCL all-reduce: " + std::to_string(arrays.size()) + " arrays for " +
                        std::to_string(comms_.size()) + " devices");
        }
        check(nccl_, nccl_.group_start(), "ncclGroupStart", nullptr);
        ncclResult_t first_failure = ncclSuccess;
        ncclComm_t failed_comm = nullptr;
        for (size_t r = 0; r < arrays.size(); r++) {
            const ncclResult_t status = nccl_.all_reduce(arrays[r], arrays[r], n, ncclFloat32,
                                                         ncclAvg, comms_[r], streams_[r]);
            if (status != ncclSuccess && first_failure == ncclSuccess) {
                first_failure = status;
                failed_comm = comms_[r];
            }
        }
        // The group is closed even after a failed call, or NCCL stays inside it.
        const ncclResult_t ended = nccl_.group_end();
        check(nccl_, first_failure, "ncclAllReduce", failed_comm);
        check(nccl_, ended, "ncclGroupEnd", nullptr);
    }

private:
    const NcclLibrary& nccl_;
    std::vector<ncclComm_t> comms_;
    std::vector<cudaStream_t> streams_;
};

}  // namespace

std::unique_ptr<AllReduce> make_nccl_all_reduce(std::span<CudaOps* const> devices) {
    return std::make_unique<NcclAllReduce>(devices);
}

std::string nccl_version() {
    const NcclLibrary& nccl = NcclLibrary::get();
    int code = 0;
    check(nccl, nccl.get_version(&code), "ncclGetVersion", nullptr);
    // NCCL 2.9 and later: major * 10000 + minor * 100 + patch.
    return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." +
           std::to_string(code % 100);
}

}  // namespace starling::cuda
