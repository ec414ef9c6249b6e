// Choosing the backend the engine runs on, from the `device` setting of a config or flag:
//   "cpu"                     the CPU backend;
//   "cuda" or "cuda:N"        GPU N (0 when omitted); an error naming the device when it is
//   unusable; "cuda:N,M,..." or "cuda:all"
//                             several GPUs of this box (every usable one for "all"), trained as
//                             one node by data parallelism with an NCCL all-reduce;
//   "auto"                    GPU 0 when a working driver and device exist, else the CPU.
// A build without nvcc knows only "cpu" and "auto" (which then means the CPU). The device count
// of a machine with the toolkit but no driver is never trusted: cuda_device_count() returns 0.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kernels/all_reduce.h"
#include "kernels/ops.h"

namespace starling {

struct DeviceChoice {
    enum class Kind { Auto, Cpu, Cuda };
    Kind kind = Kind::Auto;
    std::vector<int> gpus;  // for Kind::Cuda, in order and distinct; empty with all_gpus
    bool all_gpus = false;  // "cuda:all"
};

// Throws starling::Error naming the setting and what is accepted.
DeviceChoice parse_device(const std::string& device);
// Checks a matmul precision name ("fp32", "tf32" or "bf16"); throws starling::Error naming it.
void check_matmul_precision(const std::string& matmul);

// True when this build has the CUDA backend.
bool cuda_backend_built();
// True when that backend runs on emulated devices (STARLING_CUDA_EMULATION): they are used only
// when named (cuda:N, cuda:all), never by "auto".
bool cuda_devices_emulated();

// Usable CUDA devices: 0 where the build has no CUDA backend or the machine no working driver or
// device, and then *reason (when given) says which.
int usable_cuda_devices(std::string* reason = nullptr);
// The CUDA devices device "auto" may take (it takes GPU 0 when there is one): the usable ones,
// none where they are emulated; when none, *reason (when given) says why. `starling check` tells
// what auto will pick by this, so it says what `starling train` and starlingd do.
int auto_cuda_devices(std::string* reason = nullptr);

struct Backend {
    // One backend per device the node trains on: the CPU, one GPU, or several GPUs of one box.
    std::vector<std::unique_ptr<Ops<float>>> devices;
    // Averages the devices' gradients; null where there is one device.
    std::unique_ptr<AllReduce> all_reduce;
    bool gpu = false;
    // What runs, for one log line: "cuda:0 (NVIDIA H100 80GB HBM3), bf16 matmuls", or
    // "cpu (16 threads)" followed, when "auto" found no GPU, by the reason
    // ("; no usable GPU: ...").
    std::string description;

    Ops<float>& lead() const { return *devices.front(); }
};

struct BackendOptions {
    std::string device = "auto";
    int cpu_threads = 0;          // 0: all cores; also the threads of the CPU work next to a GPU
    std::string matmul = "fp32";  // on a GPU: "fp32", "tf32" or "bf16" (cuda::MatmulMath)
};

Backend make_backend(const BackendOptions& options);

// Device memory the backend holds now and at most so far; 0 for the CPU backend.
size_t backend_device_bytes_in_use(const Ops<float>& ops);
size_t backend_device_peak_bytes(const Ops<float>& ops);

}  // namespace starling
