#include "kernels/backend.h"

#include <charconv>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"

#ifdef STARLING_HAVE_CUDA
#include "kernels/cuda/codec.cuh"
#include "kernels/cuda/cuda_ops.h"
#endif

namespace starling {

namespace {

std::unique_ptr<Ops<float>> cpu_backend(int threads, std::string& description) {
    set_cpu_threads(threads);
    description = "cpu (" + std::to_string(cpu_threads()) + " threads)";
    return std::make_unique<CpuOps<float>>();
}

}  // namespace

DeviceChoice parse_device(const std::string& device) {
    if (device == "auto") return {DeviceChoice::Kind::Auto, 0};
    if (device == "cpu") return {DeviceChoice::Kind::Cpu, 0};
    if (device == "cuda") return {DeviceChoice::Kind::Cuda, 0};
    const std::string prefix = "cuda:";
    if (device.starts_with(prefix)) {
        const char* first = device.data() + prefix.size();
        const char* last = device.data() + device.size();
        int index = -1;
        const auto [end, ec] = std::from_chars(first, last, index);
        if (ec == std::errc() && end == last && first != last && index >= 0) {
            return {DeviceChoice::Kind::Cuda, index};
        }
    }
    throw Error("device \"" + device + "\" is not one of \"auto\", \"cpu\", \"cuda\" or \"cuda:N\"");
}

void check_matmul_precision(const std::string& matmul) {
    if (matmul != "fp32" && matmul != "tf32" && matmul != "bf16") {
        throw Error("matmul precision \"" + matmul + "\" is not one of \"fp32\", \"tf32\" or \"bf16\"");
    }
}

bool cuda_backend_built() {
#ifdef STARLING_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

int usable_cuda_devices(std::string* reason) {
#ifdef STARLING_HAVE_CUDA
    return cuda::cuda_device_count(reason);
#else
    if (reason) *reason = "this build has no CUDA backend";
    return 0;
#endif
}

Backend make_backend(const BackendOptions& options) {
    const DeviceChoice choice = parse_device(options.device);
    check_matmul_precision(options.matmul);
    Backend backend;
    if (choice.kind == DeviceChoice::Kind::Cpu) {
        backend.ops = cpu_backend(options.cpu_threads, backend.description);
        return backend;
    }
    std::string reason;
#ifdef STARLING_HAVE_CUDA
    set_cpu_threads(options.cpu_threads);
    const cuda::MatmulMath math = options.matmul == "bf16"   ? cuda::MatmulMath::Bf16
                                  : options.matmul == "tf32" ? cuda::MatmulMath::Tf32
                                                             : cuda::MatmulMath::Fp32;
    if (choice.kind == DeviceChoice::Kind::Cuda || usable_cuda_devices(&reason) > 0) {
        try {
            auto gpu = std::make_unique<cuda::CudaOps>(choice.index, math);
            backend.description = gpu->name() + ", " + options.matmul + " matmuls";
            backend.ops = std::move(gpu);
            backend.gpu = true;
            return backend;
        } catch (const Error& e) {
            if (choice.kind == DeviceChoice::Kind::Cuda) throw;
            reason = e.what();
        }
    }
#else
    if (choice.kind == DeviceChoice::Kind::Cuda) {
        throw Error("device \"" + options.device +
                    "\": this build has no CUDA backend (nvcc was not found when it was built)");
    }
    usable_cuda_devices(&reason);
#endif
    backend.ops = cpu_backend(options.cpu_threads, backend.description);
    backend.description += "; no usable GPU: " + reason;
    return backend;
}

size_t backend_device_bytes_in_use(const Ops<float>& ops) {
#ifdef STARLING_HAVE_CUDA
    if (const auto* gpu = dynamic_cast<const cuda::CudaOps*>(&ops)) return gpu->bytes_in_use();
#endif
    (void)ops;
    return 0;
}

size_t backend_device_peak_bytes(const Ops<float>& ops) {
#ifdef STARLING_HAVE_CUDA
    if (const auto* gpu = dynamic_cast<const cuda::CudaOps*>(&ops)) return gpu->peak_bytes();
#endif
    (void)ops;
    return 0;
}

}  // namespace starling
