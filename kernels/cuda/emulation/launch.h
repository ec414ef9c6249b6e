// emulation::launch, what starling::cuda::launch (kernels/cuda/portable.cuh) calls on the
// emulator: the launch configuration is checked as a device checks it (a bad one sets
// cudaGetLastError() and runs nothing), then every thread of the grid runs the kernel on the
// calling host thread before launch returns.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cuda/emulation/scheduler.h"

namespace starling::cuda::emulation {

// The kernel's name as the compiler spells the template argument, namespaces dropped:
// "rmsnorm_forward_kernel", "attention_forward_kernel<64>".
template <auto Kernel>
std::string kernel_name() {
    const std::string_view pretty = __PRETTY_FUNCTION__;
    const std::string_view marker = "Kernel = ";
    std::string_view name = pretty.substr(pretty.find(marker) + marker.size());
    name = name.substr(0, name.find_first_of(";]"));
    if (name.starts_with('&')) name.remove_prefix(1);
    const size_t template_start = std::min(name.find('<'), name.size());
    const size_t last_scope = name.substr(0, template_start).rfind("::");
    if (last_scope != std::string_view::npos) name.remove_prefix(last_scope + 2);
    return std::string(name);
}

// Checks grid, block, dynamic shared memory (against the kernel's cudaFuncSetAttribute opt-in) and
// stream; on a bad configuration records the error for cudaGetLastError() and returns false.
bool prepare_launch(LaunchConfig& config, const void* kernel, cudaStream_t stream);

template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), std::string name, dim3 grid, dim3 block,
                   size_t dynamic_shared_bytes, cudaStream_t stream, Args&&... args) {
    LaunchConfig config{std::move(name), grid, block, dynamic_shared_bytes};
    if (!prepare_launch(config, reinterpret_cast<const void*>(kernel), stream)) return;
    // Converted once to the kernel's parameter types, as the launch does on a device.
    const std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
    run_grid(config, [&] { std::apply(kernel, params); });
}

template <auto Kernel, typename... Args>
void launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, cudaStream_t stream,
            Args&&... args) {
    launch_kernel(Kernel, kernel_name<Kernel>(), grid, block, dynamic_shared_bytes, stream,
                  std::forward<Args>(args)...);
}

template <typename T>
T& shared_variable(const void* site) {
    return *static_cast<T*>(shared_memory(site, sizeof(T), std::max<size_t>(alignof(T), 16)));
}

template <typename T>
T* dynamic_shared() {
    return static_cast<T*>(dynamic_shared_memory());
}

}  // namespace starling::cuda::emulation
