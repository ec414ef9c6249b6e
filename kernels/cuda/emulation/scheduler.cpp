// Blocks run one after another; the threads of a block are fibers (Boost.Context's fcontext: a
// switch is a few register moves, where ucontext's swapcontext makes a system call) that the
// scheduler resumes, in the configured order, until each waits at a barrier or ends. When none can
// run, the waits are checked and released (or the launch faults). See scheduler.h.
#include "kernels/cuda/emulation/scheduler.h"

#include <boost/context/detail/fcontext.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include "kernels/cuda/emulation/sanitizer_hooks.h"

namespace starling::cuda::emulation {

namespace {

// Deep enough for the kernels' per-thread arrays; ASan's redzones and TSan's frames need more.
constexpr size_t kStackBytes = sanitizer::kAddress || sanitizer::kThread ? 256 * 1024 : 64 * 1024;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr size_t kDynamicSharedAlignment = 128;

enum class State : uint8_t { Runnable, AtBlockBarrier, AtWarpBarrier, Exited };

namespace fcontext = boost::context::detail;

struct Lane {
    fcontext::fcontext_t context = nullptr;  // where the thread resumes
    char* stack = nullptr;
    uint3 index{};
    int linear = 0;
    State state = State::Runnable;
    // Where the lane waits, and for a warp barrier, which intrinsic over which lanes.
    std::source_location where;
    const char* what = "";
    unsigned mask = 0;
    unsigned barrier_generation = 0;  // of the barrier it waits at: picks the TSan token
    unsigned exchanges = 0;           // data collectives so far: picks the exchange area
    void* fiber = nullptr;            // TSan's
    void* fake_stack = nullptr;       // ASan's
};

struct SharedVariable {
    const void* site;
    void* memory;
    size_t bytes;
};

struct Warp {
    unsigned generation = 0;
    char tokens[2] = {};
};

struct BlockRun {
    const LaunchConfig* config = nullptr;
    const std::function<void()>* body = nullptr;
    uint3 block{};
    size_t sequence = 0;  // of the block in the launch's run order
    std::vector<Lane> lanes;
    std::vector<Warp> warps;
    std::vector<SharedVariable> shared;
    size_t static_shared_bytes = 0;
    void* dynamic_shared = nullptr;
    std::vector<unsigned char> exchange;  // per warp: two areas of 32 * kExchangeBytes
    unsigned block_generation = 0;
    char block_tokens[2] = {};
    char* start_token = nullptr;  // released by the host before the launch
    char block_start_token = 0;   // released by the host once the block's memory is set up
    char* end_token = nullptr;    // released by every thread as it ends
    Lane* current = nullptr;
    std::string fault;                         // set by the thread that faulted
    fcontext::fcontext_t scheduler = nullptr;  // where the running thread returns to
    void* scheduler_fiber = nullptr;
    void* scheduler_fake_stack = nullptr;
    const void* scheduler_stack_bottom = nullptr;
    size_t scheduler_stack_size = 0;
};

thread_local BlockRun* running = nullptr;

// Thrown inside a faulting thread to unwind its stack back to lane_main.
struct LaneFault {};

std::atomic<Order> configured_order{Order::Forward};
std::atomic<uint64_t> configured_seed{1};
std::once_flag order_from_environment;

void read_order_from_environment() {
    const char* value = std::getenv("STARLING_EMULATION_ORDER");
    if (value == nullptr) return;
    const std::string_view order(value);
    if (order == "forward") {
        configured_order = Order::Forward;
    } else if (order == "reverse") {
        configured_order = Order::Reverse;
    } else if (order.starts_with("shuffle")) {
        configured_order = Order::Shuffle;
        if (order.starts_with("shuffle:")) configured_seed = std::strtoull(value + 8, nullptr, 10);
    } else {
        throw Error("STARLING_EMULATION_ORDER=\"" + std::string(order) +
                    "\" is not one of forward, reverse, shuffle or shuffle:SEED");
    }
}

std::string format(uint3 v) {
    return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

// "kernels/cuda/rows.cu:121", the path cut to the project's own directories.
std::string site(const std::source_location& where) {
    std::string_view file = where.file_name();
    for (const std::string_view root : {"kernels/", "tests/"}) {
        const size_t at = file.rfind(root);
        if (at != std::string_view::npos) {
            file.remove_prefix(at);
            break;
        }
    }
    return std::string(file) + ":" + std::to_string(where.line());
}

bool same_site(const std::source_location& a, const std::source_location& b) {
    return a.line() == b.line() && a.column() == b.column() &&
           std::strcmp(a.file_name(), b.file_name()) == 0;
}

std::string describe(const BlockRun& run, const Lane& lane) {
    return "kernel " + run.config->kernel + ", block " + format(run.block) + ", thread " +
           format(lane.index);
}

// Ends the running thread's kernel from inside it: the thread unwinds, the scheduler throws.
[[noreturn]] void lane_fault(const std::string& problem);

[[noreturn]] void block_fault(const BlockRun& run, const Lane& lane, const std::string& problem) {
    throw KernelFault(describe(run, lane) + ": " + problem);
}

// Stacks are reused from block to block. (Under TSan each stack stays with one fiber, below: a
// fiber running on a stack another fiber used would look like a race.)
class StackPool {
public:
    char* take() {
        if (free_.empty()) return static_cast<char*>(std::malloc(kStackBytes));
        char* stack = free_.back();
        free_.pop_back();
        return stack;
    }
    void give_back(char* stack) {
        sanitizer::unpoison(stack, kStackBytes);
        free_.push_back(stack);
    }
    ~StackPool() {
        for (char* stack : free_) std::free(stack);
    }

private:
    std::vector<char*> free_;
};

thread_local StackPool stacks;

// TSan's fibers, reused with their stacks: creating a fiber clears most of a megabyte, and TSan's
// allocator maps and unmaps every stack. Consecutive blocks take their threads' fibers from
// alternate sets, so a race between two neighbouring blocks is still one between two fibers (blocks
// two apart share fibers, which TSan sees as ordered: a race between them alone goes unseen).
class FiberSets {
public:
    struct Fiber {
        void* fiber;
        char* stack;
    };
    Fiber get(size_t set, size_t index, const std::string& name) {
        std::vector<Fiber>& fibers = sets_[set % 2];
        while (fibers.size() <= index) {
            fibers.push_back({sanitizer::create_fiber(name.c_str()), stacks.take()});
        }
        sanitizer::name_fiber(fibers[index].fiber, name.c_str());
        return fibers[index];
    }

private:
    std::vector<Fiber> sets_[2];
};

thread_local FiberSets fibers;

void switch_to_scheduler(BlockRun& run, Lane& lane, bool ending) {
    sanitizer::switch_to(run.scheduler_fiber);
    sanitizer::start_switch(ending ? nullptr : &lane.fake_stack, run.scheduler_stack_bottom,
                            run.scheduler_stack_size);
    run.scheduler = fcontext::jump_fcontext(run.scheduler, nullptr).fctx;
    sanitizer::finish_switch(lane.fake_stack, nullptr, nullptr);
}

void lane_main(fcontext::transfer_t from) {
    BlockRun& run = *running;
    Lane& lane = *run.current;
    run.scheduler = from.fctx;
    sanitizer::finish_switch(nullptr, &run.scheduler_stack_bottom, &run.scheduler_stack_size);
    sanitizer::acquire(run.start_token);
    sanitizer::acquire(&run.block_start_token);  // a reused fiber did not see the host set up
    try {
        (*run.body)();
    } catch (const LaneFault&) {
        // run.fault says what happened.
    } catch (const std::exception& e) {
        run.fault = describe(run, lane) + ": the kernel threw: " + e.what();
    }
    lane.state = State::Exited;
    sanitizer::release(run.end_token);
    switch_to_scheduler(run, lane, true);
}

void resume(BlockRun& run, Lane& lane) {
    run.current = &lane;
    sanitizer::switch_to(lane.fiber);
    sanitizer::start_switch(&run.scheduler_fake_stack, lane.stack, kStackBytes);
    lane.context = fcontext::jump_fcontext(lane.context, nullptr).fctx;
    sanitizer::finish_switch(run.scheduler_fake_stack, nullptr, nullptr);
    run.current = nullptr;
}

Lane& current_lane(const char* what) {
    if (running == nullptr || running->current == nullptr) {
        throw Error(std::string(what) + " called outside a kernel running on the emulator");
    }
    return *running->current;
}

// Parks the running thread until the scheduler releases its barrier, with the happens-before
// edges of a barrier: everything before it in any participant, before everything after it in all.
void wait(BlockRun& run, Lane& lane, char* tokens, unsigned generation) {
    lane.barrier_generation = generation;
    sanitizer::release(&tokens[generation % 2]);
    switch_to_scheduler(run, lane, false);
    sanitizer::acquire(&tokens[generation % 2]);
}

std::vector<int> run_order_of(size_t n, Order order, std::mt19937_64& random) {
    std::vector<int> indices(n);
    std::iota(indices.begin(), indices.end(), 0);
    if (order == Order::Reverse) std::reverse(indices.begin(), indices.end());
    if (order == Order::Shuffle) std::shuffle(indices.begin(), indices.end(), random);
    return indices;
}

std::string lane_name(const Lane& lane) {
    return "lane " + std::to_string(lane.linear % kWarpSize);
}

// Releases every warp barrier whose lanes have all arrived; faults where one cannot complete.
// Returns whether any was released.
bool release_warps(BlockRun& run) {
    bool released = false;
    const int count = int(run.lanes.size());
    for (int first = 0; first < count; first += kWarpSize) {
        const int lanes_in_warp = std::min(kWarpSize, count - first);
        Warp& warp = run.warps[size_t(first / kWarpSize)];
        for (int l = 0; l < lanes_in_warp; l++) {
            Lane& waiting = run.lanes[size_t(first + l)];
            if (waiting.state != State::AtWarpBarrier) continue;
            const std::string at = std::string(waiting.what) + " at " + site(waiting.where);
            if (lanes_in_warp < kWarpSize && (waiting.mask >> lanes_in_warp) != 0) {
                block_fault(run, waiting, at + ": mask names lanes past the end of the block");
            }
            for (int m = 0; m < lanes_in_warp; m++) {
                if ((waiting.mask >> m & 1u) == 0) continue;
                const Lane& other = run.lanes[size_t(first + m)];
                if (other.state == State::Exited) {
                    block_fault(run, waiting, at + ": " + lane_name(other) + " of the mask exited");
                }
                if (other.state == State::AtBlockBarrier) {
                    block_fault(run, waiting,
                                at + ": " + lane_name(other) +
                                    " of the mask waits at __syncthreads at " + site(other.where) +
                                    " (diverged)");
                }
                if (other.mask != waiting.mask || !same_site(other.where, waiting.where) ||
                    std::strcmp(other.what, waiting.what) != 0) {
                    block_fault(run, waiting,
                                at + ": " + lane_name(other) + " of the mask waits at " +
                                    other.what + " at " + site(other.where) + " (diverged)");
                }
            }
            const unsigned mask = waiting.mask;
            for (int m = 0; m < lanes_in_warp; m++) {
                if (mask >> m & 1u) run.lanes[size_t(first + m)].state = State::Runnable;
            }
            warp.generation++;
            released = true;
        }
    }
    return released;
}

// Releases __syncthreads when every thread waits at the same one; faults where it cannot complete.
void release_block(BlockRun& run) {
    const Lane* waiting = nullptr;
    for (const Lane& lane : run.lanes) {
        if (lane.state == State::AtBlockBarrier) {
            waiting = &lane;
            break;
        }
    }
    if (waiting == nullptr) {
        throw KernelFault("kernel " + run.config->kernel + ", block " + format(run.block) +
                          ": deadlock, no thread can proceed");
    }
    const std::string at = "__syncthreads at " + site(waiting->where);
    for (const Lane& lane : run.lanes) {
        if (lane.state == State::Exited) {
            block_fault(run, *waiting,
                        at + " is not reached by thread " + format(lane.index) + ", which exited");
        }
        if (!same_site(lane.where, waiting->where)) {
            block_fault(run, *waiting,
                        at + ": thread " + format(lane.index) + " waits at __syncthreads at " +
                            site(lane.where) + " instead");
        }
    }
    for (Lane& lane : run.lanes) lane.state = State::Runnable;
    run.block_generation++;
}

void release_memory(BlockRun& run) {
    const sanitizer::IgnoreAccesses ignore;
    for (Lane& lane : run.lanes) {
        if (lane.stack && !sanitizer::kThread) stacks.give_back(lane.stack);
    }
    for (const SharedVariable& v : run.shared) std::free(v.memory);
    std::free(run.dynamic_shared);
    // Everything the block's threads touched goes now, where TSan is told to look away.
    run.exchange = std::vector<unsigned char>();
    run.lanes = std::vector<Lane>();
    run.warps = std::vector<Warp>();
    run.shared = std::vector<SharedVariable>();
    run.fault = std::string();
}

void* junk_filled(size_t bytes, size_t alignment) {
    void* memory = nullptr;
    if (posix_memalign(&memory, alignment, std::max<size_t>(bytes, 1)) != 0) {
        throw Error("emulator: out of host memory for shared memory");
    }
    std::memset(memory, 0xff, bytes);
    return memory;
}

void run_block(BlockRun& run, Order order, std::mt19937_64& random) {
    const LaunchConfig& config = *run.config;
    const dim3 b = config.block;
    const size_t count = size_t(b.x) * b.y * b.z;
    run.lanes.resize(count);
    run.warps.resize((count + kWarpSize - 1) / kWarpSize);
    run.exchange.assign(run.warps.size() * 2 * kWarpSize * kExchangeBytes, 0xff);
    {
        const sanitizer::IgnoreAccesses ignore;
        run.dynamic_shared = junk_filled(config.dynamic_shared_bytes, kDynamicSharedAlignment);
    }
    run.scheduler_fiber = sanitizer::current_fiber();
    for (size_t i = 0; i < count; i++) {
        Lane& lane = run.lanes[i];
        lane.linear = int(i);
        lane.index = {unsigned(i % b.x), unsigned(i / b.x % b.y),
                      unsigned(i / (size_t(b.x) * b.y))};
        if (sanitizer::kThread) {
            const std::string name =
                config.kernel + " block " + format(run.block) + " thread " + format(lane.index);
            const FiberSets::Fiber fiber = fibers.get(run.sequence, i, name);
            lane.fiber = fiber.fiber;
            lane.stack = fiber.stack;
        } else {
            lane.stack = stacks.take();
        }
        if (lane.stack == nullptr) throw Error("emulator: out of host memory for thread stacks");
        lane.context = fcontext::make_fcontext(lane.stack + kStackBytes, kStackBytes, lane_main);
    }
    sanitizer::release(&run.block_start_token);
    while (true) {
        for (const int i : run_order_of(count, order, random)) {
            Lane& lane = run.lanes[size_t(i)];
            if (lane.state != State::Runnable) continue;
            resume(run, lane);
            if (!run.fault.empty()) {
                sanitizer::acquire(
                    run.end_token);  // the faulting thread's message is the host's now
                throw KernelFault(run.fault);
            }
        }
        if (std::all_of(run.lanes.begin(), run.lanes.end(),
                        [](const Lane& l) { return l.state == State::Exited; })) {
            return;
        }
        if (!release_warps(run)) release_block(run);
    }
}

}  // namespace

Order run_order() {
    std::call_once(order_from_environment, read_order_from_environment);
    return configured_order;
}

void set_run_order(Order order, uint64_t seed) {
    std::call_once(order_from_environment, read_order_from_environment);
    configured_order = order;
    configured_seed = seed;
}

void run_grid(const LaunchConfig& config, const std::function<void()>& body) {
    if (running != nullptr) throw Error("emulator: a kernel launched another kernel");
    const Order order = run_order();
    std::mt19937_64 random(configured_seed.load());
    const dim3 g = config.grid;
    const size_t blocks = size_t(g.x) * g.y * g.z;
    char start_token = 0, end_token = 0;
    sanitizer::release(&start_token);
    // Blocks run in the same order as threads, so code that assumes block 0 runs first shows too.
    std::vector<int> block_order;
    if (blocks <= (size_t(1) << 24)) block_order = run_order_of(blocks, order, random);
    for (size_t n = 0; n < blocks; n++) {
        const size_t i = block_order.empty() ? n : size_t(block_order[n]);
        BlockRun run;
        run.config = &config;
        run.body = &body;
        run.sequence = n;
        run.block = {unsigned(i % g.x), unsigned(i / g.x % g.y), unsigned(i / (size_t(g.x) * g.y))};
        run.start_token = &start_token;
        run.end_token = &end_token;
        running = &run;
        try {
            run_block(run, order, random);
        } catch (...) {
            running = nullptr;
            release_memory(run);
            throw;
        }
        running = nullptr;
        release_memory(run);
    }
    sanitizer::acquire(&end_token);
}

namespace {

void lane_fault(const std::string& problem) {
    Lane& lane = current_lane("fault");
    running->fault = describe(*running, lane) + ": " + problem;
    throw LaneFault{};
}

}  // namespace

uint3 thread_index() { return current_lane("threadIdx").index; }

uint3 block_index() {
    current_lane("blockIdx");
    return running->block;
}

dim3 block_dim() {
    current_lane("blockDim");
    return running->config->block;
}

dim3 grid_dim() {
    current_lane("gridDim");
    return running->config->grid;
}

int lane_index() { return current_lane("lane index").linear % kWarpSize; }

void block_barrier(std::source_location where) {
    Lane& lane = current_lane("__syncthreads");
    BlockRun& run = *running;
    lane.state = State::AtBlockBarrier;
    lane.where = where;
    wait(run, lane, run.block_tokens, run.block_generation);
}

void warp_barrier(unsigned mask, const char* what, std::source_location where) {
    Lane& lane = current_lane(what);
    BlockRun& run = *running;
    const int lane_in_warp = lane.linear % kWarpSize;
    if ((mask >> lane_in_warp & 1u) == 0) {
        fault(
            std::string(what) + " with mask 0x" +
                [&] {
                    char hex[9];
                    std::snprintf(hex, sizeof hex, "%08x", mask);
                    return std::string(hex);
                }() +
                ", which does not name the calling lane " + std::to_string(lane_in_warp),
            where);
    }
    Warp& warp = run.warps[size_t(lane.linear / kWarpSize)];
    lane.state = State::AtWarpBarrier;
    lane.where = where;
    lane.what = what;
    lane.mask = mask;
    wait(run, lane, warp.tokens, warp.generation);
}

void* warp_exchange_area(size_t bytes) {
    Lane& lane = current_lane("warp collective");
    if (bytes > kExchangeBytes)
        throw Error("emulator: warp exchange of more than 128 bytes a lane");
    const size_t warp = size_t(lane.linear / kWarpSize);
    const size_t area = warp * 2 + lane.exchanges++ % 2;
    return running->exchange.data() + area * kWarpSize * kExchangeBytes;
}

void require_full_warp(unsigned mask, const char* what, std::source_location where) {
    if (mask != kFullMask) {
        fault(std::string(what) + ": the emulator runs data collectives over the whole warp only",
              where);
    }
}

void* shared_memory(const void* site_key, size_t bytes, size_t alignment) {
    current_lane("shared memory");
    BlockRun& run = *running;
    for (const SharedVariable& v : run.shared) {
        if (v.site == site_key) return v.memory;
    }
    // A device takes at most 48 KiB of static shared memory, and 48 KiB in all unless the kernel
    // opted in to more dynamic shared memory.
    const size_t static_bytes = run.static_shared_bytes + bytes;
    const size_t limit = run.config->dynamic_shared_limit > kDefaultSharedBytes
                             ? kMaxOptInSharedBytes
                             : kDefaultSharedBytes;
    if (static_bytes > kDefaultSharedBytes ||
        static_bytes + run.config->dynamic_shared_bytes > limit) {
        lane_fault("shared memory of " + std::to_string(static_bytes) + " static and " +
                   std::to_string(run.config->dynamic_shared_bytes) +
                   " dynamic bytes exceeds the block's limit of " + std::to_string(limit));
    }
    const sanitizer::IgnoreAccesses ignore;
    void* memory = junk_filled(bytes, alignment);
    run.shared.push_back({site_key, memory, bytes});
    run.static_shared_bytes = static_bytes;
    return memory;
}

void* dynamic_shared_memory() {
    current_lane("dynamic shared memory");
    return running->dynamic_shared;
}

void fault(const std::string& problem, std::source_location where) {
    lane_fault(problem + " at " + site(where));
}

}  // namespace starling::cuda::emulation
