// The emulated runtime: devices, device memory, streams, errors, and the launch checks.
#include "kernels/cuda/emulation/runtime.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/cuda/emulation/launch.h"
#include "kernels/cuda/emulation/sanitizer_hooks.h"

struct CUstream_st {
    int device;
};

namespace starling::cuda::emulation {

namespace {

constexpr size_t kDeviceBytes = size_t(16) << 30;  // what each emulated device reports and allows
constexpr size_t kAllocationAlignment = 256;       // as cudaMalloc guarantees
constexpr int kMaxDevices = 16;

struct Allocation {
    size_t bytes;
    int device;
};

struct Devices {
    std::mutex mutex;
    std::map<uintptr_t, Allocation> allocations;  // by start address
    std::vector<size_t> in_use;                   // per device
    std::set<const CUstream_st*> streams;
    std::unordered_map<const void*, size_t> shared_limits;  // per kernel
    int count = 0;
    std::string count_error;
};

Devices& devices() {
    static Devices* d = [] {
        auto* made = new Devices;  // never destroyed: static objects may free memory after it
        const char* value = std::getenv("STARLING_EMULATED_DEVICES");
        made->count = 1;
        if (value != nullptr) {
            const std::string text(value);
            int count = -1;
            const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), count);
            if (ec != std::errc() || end != text.data() + text.size() || count < 0 ||
                count > kMaxDevices) {
                made->count = 0;
                made->count_error = "STARLING_EMULATED_DEVICES=\"" + text +
                                    "\" is not a device count from 0 to " +
                                    std::to_string(kMaxDevices);
            } else {
                made->count = count;
            }
        }
        made->in_use.assign(size_t(std::max(made->count, 1)), 0);
        return made;
    }();
    return *d;
}

thread_local cudaError_t last_error = cudaSuccess;
thread_local int current_device = 0;

// The allocation holding [p, p + bytes), or null. Caller holds the mutex.
const Allocation* find_allocation(Devices& d, const void* p, size_t bytes) {
    const auto address = reinterpret_cast<uintptr_t>(p);
    auto it = d.allocations.upper_bound(address);
    if (it == d.allocations.begin()) return nullptr;
    --it;
    if (address + bytes > it->first + it->second.bytes) return nullptr;
    return &it->second;
}

bool holds(const void* p, size_t bytes) {
    Devices& d = devices();
    const std::lock_guard lock(d.mutex);
    return find_allocation(d, p, bytes) != nullptr;
}

// The direction's device side(s) must lie inside live allocations, the host side outside them.
bool valid_transfer(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    const bool dst_device = holds(dst, bytes), src_device = holds(src, bytes);
    switch (kind) {
        case cudaMemcpyHostToDevice: return dst_device && !holds(src, 1);
        case cudaMemcpyDeviceToHost: return src_device && !holds(dst, 1);
        case cudaMemcpyDeviceToDevice: return dst_device && src_device;
        case cudaMemcpyHostToHost: return !holds(dst, 1) && !holds(src, 1);
        case cudaMemcpyDefault: return true;
    }
    return false;
}

}  // namespace

cudaError_t record_error(cudaError_t error) {
    if (error != cudaSuccess) last_error = error;
    return error;
}

bool is_device_pointer(const void* p) { return holds(p, 1); }

size_t device_bytes_in_use() {
    Devices& d = devices();
    const std::lock_guard lock(d.mutex);
    size_t total = 0;
    for (const size_t bytes : d.in_use) total += bytes;
    return total;
}

size_t dynamic_shared_limit(const void* kernel) {
    Devices& d = devices();
    const std::lock_guard lock(d.mutex);
    const auto it = d.shared_limits.find(kernel);
    return it == d.shared_limits.end() ? kDefaultSharedBytes : it->second;
}

bool is_live_stream(cudaStream_t stream) {
    if (stream == nullptr) return true;
    Devices& d = devices();
    const std::lock_guard lock(d.mutex);
    return d.streams.count(stream) > 0;
}

bool prepare_launch(LaunchConfig& config, const void* kernel, cudaStream_t stream) {
    const dim3 g = config.grid, b = config.block;
    const size_t threads = size_t(b.x) * b.y * b.z;
    if (threads == 0 || threads > kMaxThreadsPerBlock || b.z > kMaxBlockZ || g.x == 0 || g.y == 0 ||
        g.z == 0 || g.x > kMaxGridX || g.y > kMaxGridYZ || g.z > kMaxGridYZ) {
        record_error(cudaErrorInvalidConfiguration);
        return false;
    }
    config.dynamic_shared_limit = dynamic_shared_limit(kernel);
    if (config.dynamic_shared_bytes > config.dynamic_shared_limit) {
        record_error(cudaErrorInvalidValue);
        return false;
    }
    if (!is_live_stream(stream)) {
        record_error(cudaErrorInvalidResourceHandle);
        return false;
    }
    return true;
}

}  // namespace starling::cuda::emulation

using namespace starling::cuda::emulation;

cudaError_t cudaGetDeviceCount(int* count) {
    Devices& d = devices();
    *count = d.count;
    return record_error(d.count == 0 ? cudaErrorNoDevice : cudaSuccess);
}

cudaError_t cudaSetDevice(int device) {
    if (device < 0 || device >= devices().count) return record_error(cudaErrorInvalidDevice);
    current_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
    *device = current_device;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
    if (device < 0 || device >= devices().count) return record_error(cudaErrorInvalidDevice);
    *prop = cudaDeviceProp{};
    std::snprintf(prop->name, sizeof prop->name, "emulated device %d", device);
    prop->totalGlobalMem = kDeviceBytes;
    prop->sharedMemPerBlock = kDefaultSharedBytes;
    prop->sharedMemPerBlockOptin = kMaxOptInSharedBytes;
    prop->warpSize = kWarpSize;
    prop->maxThreadsPerBlock = int(kMaxThreadsPerBlock);
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = int(kMaxThreadsPerBlock);
    prop->maxThreadsDim[2] = int(kMaxBlockZ);
    prop->maxGridSize[0] = int(kMaxGridX);
    prop->maxGridSize[1] = prop->maxGridSize[2] = int(kMaxGridYZ);
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    return cudaSuccess;
}

cudaError_t cudaGetLastError() {
    const cudaError_t error = last_error;
    last_error = cudaSuccess;
    return error;
}

cudaError_t cudaPeekAtLastError() { return last_error; }

const char* cudaGetErrorString(cudaError_t error) {
    switch (error) {
        case cudaSuccess: return "no error";
        case cudaErrorInvalidValue: return "invalid argument";
        case cudaErrorMemoryAllocation: return "out of memory";
        case cudaErrorInvalidConfiguration: return "invalid configuration argument";
        case cudaErrorInvalidDevicePointer: return "invalid device pointer";
        case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
        case cudaErrorInvalidResourceHandle: return "invalid resource handle";
        case cudaErrorInvalidDevice: return "invalid device ordinal";
        case cudaErrorNoDevice:
            return devices().count_error.empty() ? "no CUDA-capable device is detected"
                                                 : devices().count_error.c_str();
    }
    return "unknown error";
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
    *ptr = nullptr;
    Devices& d = devices();
    if (current_device >= d.count) return record_error(cudaErrorNoDevice);
    {
        const std::lock_guard lock(d.mutex);
        if (bytes > kDeviceBytes - d.in_use[size_t(current_device)]) {
            return record_error(cudaErrorMemoryAllocation);
        }
    }
    void* memory = nullptr;
    if (posix_memalign(&memory, kAllocationAlignment, std::max<size_t>(bytes, 1)) != 0) {
        return record_error(cudaErrorMemoryAllocation);
    }
    std::memset(memory, 0xff, bytes);  // what a kernel reads from memory nobody wrote: NaN
    const std::lock_guard lock(d.mutex);
    d.allocations[reinterpret_cast<uintptr_t>(memory)] = {bytes, current_device};
    d.in_use[size_t(current_device)] += bytes;
    *ptr = memory;
    return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
    if (ptr == nullptr) return cudaSuccess;
    Devices& d = devices();
    {
        const std::lock_guard lock(d.mutex);
        const auto it = d.allocations.find(reinterpret_cast<uintptr_t>(ptr));
        if (it == d.allocations.end()) return record_error(cudaErrorInvalidDevicePointer);
        d.in_use[size_t(it->second.device)] -= it->second.bytes;
        d.allocations.erase(it);
    }
    std::free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** ptr, size_t bytes, cudaStream_t stream) {
    if (!is_live_stream(stream)) return record_error(cudaErrorInvalidResourceHandle);
    return cudaMalloc(ptr, bytes);
}

cudaError_t cudaFreeAsync(void* ptr, cudaStream_t stream) {
    if (!is_live_stream(stream)) return record_error(cudaErrorInvalidResourceHandle);
    return cudaFree(ptr);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return cudaSuccess;
    if (!valid_transfer(dst, src, bytes, kind)) return record_error(cudaErrorInvalidValue);
    std::memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
    if (!is_live_stream(stream)) return record_error(cudaErrorInvalidResourceHandle);
    return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemset(void* ptr, int value, size_t bytes) {
    if (bytes == 0) return cudaSuccess;
    if (!holds(ptr, bytes)) return record_error(cudaErrorInvalidValue);
    std::memset(ptr, value, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* ptr, int value, size_t bytes, cudaStream_t stream) {
    if (!is_live_stream(stream)) return record_error(cudaErrorInvalidResourceHandle);
    return cudaMemset(ptr, value, bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
    (void)flags;
    Devices& d = devices();
    if (current_device >= d.count) return record_error(cudaErrorNoDevice);
    *stream = new CUstream_st{current_device};
    const std::lock_guard lock(d.mutex);
    d.streams.insert(*stream);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
    Devices& d = devices();
    {
        const std::lock_guard lock(d.mutex);
        if (stream == nullptr || d.streams.erase(stream) == 0) {
            return record_error(cudaErrorInvalidResourceHandle);
        }
    }
    delete stream;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    return is_live_stream(stream) ? cudaSuccess : record_error(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaFuncSetAttribute(const void* kernel, cudaFuncAttribute attribute, int value) {
    if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 ||
        size_t(value) > kMaxOptInSharedBytes) {
        return record_error(cudaErrorInvalidValue);
    }
    Devices& d = devices();
    const std::lock_guard lock(d.mutex);
    d.shared_limits[kernel] = size_t(value);
    return cudaSuccess;
}
