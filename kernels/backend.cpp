#include "kernels/backend.h"

#include <algorithm>
#include <charconv>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"

#ifdef STARLING_HAVE_CUDA
#include "kernels/cuda/cuda_ops.h"
#endif
#ifdef STARLING_HAVE_NCCL
#include "kernels/cuda/nccl/nccl_all_reduce.h"
#endif

namespace starling {

namespace {

std::unique_ptr<Ops<float>> cpu_backend(int threads, std::string& description) {
    set_cpu_threads(threads);
    description = "cpu (" + std::to_string(cpu_threads()) + " threads)";
    return std::make_unique<CpuOps<float>>();
}

[[noreturn]] void refuse_device(const std::string& device) {
    throw Error("device \"" + device +
                "\" is not one of \"auto\", \"cpu\", \"cuda\", \"cuda:N\", "
                "\"cuda:N,M,...\" or \"cuda:all\"");
}

}  // namespace

DeviceChoice parse_device(const std::string& device) {
    if (device == "auto") return {DeviceChoice::Kind::Auto, {}, false};
    if (device == "cpu") return {DeviceChoice::Kind::Cpu, {}, false};
    if (device == "cuda") return {DeviceChoice::Kind::Cuda, {0}, false};
    if (device == "cuda:all") return {DeviceChoice::Kind::Cuda, {}, true};
    const std::string prefix = "cuda:";
    if (!device.starts_with(prefix)) refuse_device(device);
    DeviceChoice choice{DeviceChoice::Kind::Cuda, {}, false};
    const char* first = device.data() + prefix.size();
    const char* const last = device.data() + device.size();
    while (true) {
        int index = -1;
        const auto [end, ec] = std::from_chars(first, last, index);
        if (ec != std::errc() || end == first || index < 0) refuse_device(device);
        if (std::find(choice.gpus.begin(), choice.gpus.end(), index) != choice.gpus.end()) {
            throw Error("device \"" + device + "\" names cuda:" + std::to_string(index) + " twice");
        }
        choice.gpus.push_back(index);
        if (end == last) return choice;
        if (*end != ',') refuse_device(device);
        first = end + 1;
    }
}

void check_matmul_precision(const std::string& matmul) {
    if (matmul != "fp32" && matmul != "tf32" && matmul != "bf16") {
        throw Error("matmul precision \"" + matmul +
                    "\" is not one of \"fp32\", \"tf32\" or \"bf16\"");
    }
}

bool cuda_backend_built() {
#ifdef STARLING_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

bool cuda_devices_emulated() {
#if STARLING_CUDA_EMULATION
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

int auto_cuda_devices(std::string* reason) {
#if STARLING_CUDA_EMULATION
    // Emulated devices check the kernels; they train far slower than the CPU backend, so only a
    // device named cuda:N uses them.
    if (reason) *reason = "this build's CUDA devices are emulated (name cuda:N to use one)";
    return 0;
#else
    return usable_cuda_devices(reason);
#endif
}

#ifdef STARLING_HAVE_CUDA
namespace {

std::vector<int> every_usable_gpu(const std::string& device) {
    std::string reason;
    const int count = usable_cuda_devices(&reason);
    if (count == 0) throw Error("device \"" + device + "\": no usable GPU: " + reason);
    std::vector<int> gpus(static_cast<size_t>(count));
    for (int i = 0; i < count; i++) gpus[static_cast<size_t>(i)] = i;
    return gpus;
}

Backend gpu_backend(const std::vector<int>& gpus, const BackendOptions& options) {
    const cuda::MatmulMath math = options.matmul == "bf16"   ? cuda::MatmulMath::Bf16
                                  : options.matmul == "tf32" ? cuda::MatmulMath::Tf32
                                                             : cuda::MatmulMath::Fp32;
    Backend backend;
    std::vector<cuda::CudaOps*> cuda_devices;
    for (const int index : gpus) {
        auto gpu = std::make_unique<cuda::CudaOps>(index, math);
        cuda_devices.push_back(gpu.get());
        backend.description += (backend.description.empty() ? "" : ", ") + gpu->name();
        backend.devices.push_back(std::move(gpu));
    }
    backend.description += ", " + options.matmul + " matmuls";
    backend.gpu = true;
    if (gpus.size() > 1) {
#if STARLING_CUDA_EMULATION
        // Emulated devices hold host memory, which the host all-reduce averages as NCCL would.
        backend.all_reduce = std::make_unique<HostAllReduce>();
        backend.description += ", host all-reduce";
#elif defined(STARLING_HAVE_NCCL)
        backend.all_reduce = cuda::make_nccl_all_reduce(cuda_devices);
        backend.description += ", NCCL " + cuda::nccl_version() + " all-reduce";
#else
        throw Error("device \"" + options.device +
                    "\": this build has no NCCL (nccl.h was not found when it was built), so it "
                    "trains on one GPU only");
#endif
    }
    return backend;
}

}  // namespace
#endif

Backend make_backend(const BackendOptions& options) {
    const DeviceChoice choice = parse_device(options.device);
    check_matmul_precision(options.matmul);
    Backend backend;
    if (choice.kind == DeviceChoice::Kind::Cpu) {
        backend.devices.push_back(cpu_backend(options.cpu_threads, backend.description));
        return backend;
    }
    std::string reason;
#ifdef STARLING_HAVE_CUDA
    set_cpu_threads(options.cpu_threads);
    if (choice.kind == DeviceChoice::Kind::Cuda) {
        return gpu_backend(choice.all_gpus ? every_usable_gpu(options.device) : choice.gpus,
                           options);
    }
    if (auto_cuda_devices(&reason) > 0) {
        try {
            return gpu_backend({0}, options);
        } catch (const Error& e) {
            reason = e.what();
        }
    }
#else
    if (choice.kind == DeviceChoice::Kind::Cuda) {
        throw Error("device \"" + options.device +
                    "\": this build has no CUDA backend (nvcc was not found when it was built)");
    }
    auto_cuda_devices(&reason);
#endif
    backend.devices.push_back(cpu_backend(options.cpu_threads, backend.description));
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
