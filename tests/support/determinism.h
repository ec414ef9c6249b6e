// Bit-for-bit reproducibility: an op run twice on two threads, and once on one, must give the
// same bytes.
#pragma once

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_ops.h"

namespace starling::test {

// Sets the CPU thread count for the life of the object, then restores the previous one.
class ScopedCpuThreads {
public:
    explicit ScopedCpuThreads(int threads) : previous_(cpu_threads()) { set_cpu_threads(threads); }
    ~ScopedCpuThreads() { set_cpu_threads(previous_); }
    ScopedCpuThreads(const ScopedCpuThreads&) = delete;
    ScopedCpuThreads& operator=(const ScopedCpuThreads&) = delete;

private:
    int previous_;
};

// run() computes and returns the op's outputs with the current thread count.
template <typename Run>
void require_same_bits_for_any_thread_count(const Run& run) {
    const int previous = cpu_threads();
    set_cpu_threads(2);
    const auto first = run();
    const auto second = run();
    set_cpu_threads(1);
    const auto single = run();
    set_cpu_threads(previous);
    using Element = typename decltype(first)::value_type;
    REQUIRE(first.size() == single.size());
    REQUIRE(std::memcmp(first.data(), second.data(), first.size() * sizeof(Element)) == 0);
    REQUIRE(std::memcmp(first.data(), single.data(), first.size() * sizeof(Element)) == 0);
}

}  // namespace starling::test
