// The emulated device's execution model: a launch runs its blocks one after another on the calling
// host thread, and the threads of a block as fibers that run until they reach a synchronisation
// point (__syncthreads, a warp collective, the end of the kernel). Between two such points the
// threads run one at a time, in an order chosen per launch (forward, reverse or shuffled), so a
// kernel whose result depends on that order shows it.
//
// When every thread of a block is waiting, the scheduler checks that the wait is one a device could
// complete and otherwise ends the launch with a KernelFault naming the kernel, the block, the
// thread and the source line:
//   - __syncthreads not reached by every thread of the block (one exited, or waits elsewhere), or
//     reached at different call sites;
//   - a warp collective whose mask names a lane that exited, waits at another call site, or does
//     not exist;
//   - a deadlock (threads waiting at points that can never all be reached).
// Shared memory is allocated per block and per variable and filled with 0xff bytes (a NaN in every
// float) before the block starts using it; device memory is filled the same way by cudaMalloc.
//
// Under ThreadSanitizer every thread of every block is a fiber of its own, and barriers and warp
// collectives are its only happens-before edges, so TSan reports any pair of unsynchronised
// accesses, in shared or global memory, within a block or between blocks. Under AddressSanitizer
// every shared variable and every cudaMalloc is a heap block of its own, so an access past one is
// reported.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <source_location>
#include <string>

#include "common/error.h"

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
    constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
    constexpr operator uint3() const { return {x, y, z}; }
};

namespace starling::cuda::emulation {

// A check of the emulator failed: the message names the kernel, block, thread and line.
class KernelFault : public Error {
public:
    using Error::Error;
};

inline constexpr int kWarpSize = 32;
// Limits of the devices the backend targets (compute capability 8.0 and 9.0).
inline constexpr unsigned kMaxThreadsPerBlock = 1024;
inline constexpr unsigned kMaxGridX = 0x7fffffffu, kMaxGridYZ = 65535;
inline constexpr unsigned kMaxBlockZ = 64;
inline constexpr size_t kDefaultSharedBytes = 48 * 1024;
inline constexpr size_t kMaxOptInSharedBytes = 227 * 1024;

// In which order the runnable threads of a block, and the blocks of a grid, are run: forward,
// reverse, or shuffled (seeded, a new permutation at every step). Set by the environment variable
// STARLING_EMULATION_ORDER = forward | reverse | shuffle | shuffle:SEED (default forward).
enum class Order { Forward, Reverse, Shuffle };
Order run_order();
void set_run_order(Order order, uint64_t seed = 1);

struct LaunchConfig {
    std::string kernel;  // "rmsnorm_forward_kernel", "attention_forward_kernel<64>"
    dim3 grid, block;
    size_t dynamic_shared_bytes = 0;
    size_t dynamic_shared_limit = kDefaultSharedBytes;  // raised by cudaFuncSetAttribute
};

// Runs body once for every thread of every block; throws KernelFault when a check fails (the
// launch is then abandoned: some blocks may have run). The launch configuration itself must have
// been validated (see launch.h).
void run_grid(const LaunchConfig& config, const std::function<void()>& body);

// Device-side services for the running thread (valid only inside run_grid's body). The indices
// are returned by value: the emulator's memory is not the kernel's, and TSan must not see the
// kernel read it.
uint3 thread_index();
uint3 block_index();
dim3 block_dim();
dim3 grid_dim();
int lane_index();  // linear thread index % 32

// The block barrier (__syncthreads) and a warp barrier over the lanes in mask (__syncwarp and the
// start of every warp collective). `what` names the intrinsic in fault messages.
void block_barrier(std::source_location where);
void warp_barrier(unsigned mask, const char* what, std::source_location where);

// Scratch memory through which the lanes of a warp exchange values in a collective: `bytes` per
// lane, lane i's part at i * bytes. A lane writes its part, passes warp_barrier, then reads the
// others' parts; two areas alternate between consecutive collectives, so the next collective's
// writes cannot overwrite what a slower lane has yet to read. bytes is at most kExchangeBytes.
inline constexpr size_t kExchangeBytes = 128;
void* warp_exchange_area(size_t bytes);

// Faults unless mask is the whole warp (the emulator's collectives that move data need every lane).
void require_full_warp(unsigned mask, const char* what, std::source_location where);

// The block's instance of the shared variable declared at `site` (all threads get the same
// memory), and the block's dynamic shared memory.
void* shared_memory(const void* site, size_t bytes, size_t alignment);
void* dynamic_shared_memory();

// Ends the launch with a KernelFault naming this thread and `where`.
[[noreturn]] void fault(const std::string& problem, std::source_location where);

}  // namespace starling::cuda::emulation
