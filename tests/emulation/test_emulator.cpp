// The device emulator (kernels/cuda/emulation/) on small kernels written here: that correct kernels
// give the right result in every run order, and that each misuse a device would punish (a thread
// skipping __syncthreads, a warp collective with an exited or diverged lane, a bad launch, too much
// shared memory, a misaligned WMMA tile) ends the launch with an error naming the kernel, the
// thread and the line. Results are checked against values computed by hand or in double on the
// host. The races and out-of-bounds accesses that only ThreadSanitizer and AddressSanitizer see are
// checked by tests/emulation/sanitized_faults.sh on the sanitized builds.
#include <catch2/catch.hpp>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/emulation/scheduler.h"
#include "kernels/cuda/portable.cuh"
#include "tests/emulation/racy_kernels.h"

using namespace starling::cuda;
using Catch::Matchers::Contains;
using emulation::KernelFault;
using emulation::Order;
using starling::test::rotate_kernel;
using starling::test::same_slot_kernel;

namespace {

constexpr unsigned kFull = 0xffffffffu;

// How the emulator names a line of this file.
std::string site(int line) { return "tests/emulation/test_emulator.cpp:" + std::to_string(line); }

// Device memory of n values copied from / to the host.
template <typename T>
class DeviceArray {
public:
    explicit DeviceArray(size_t n) : n_(n) {
        REQUIRE(cudaMalloc(reinterpret_cast<void**>(&p_), n * sizeof(T)) == cudaSuccess);
    }
    explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
        REQUIRE(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
    }
    ~DeviceArray() { cudaFree(p_); }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;
    T* get() const { return p_; }
    std::vector<T> host() const {
        std::vector<T> out(n_);
        REQUIRE(cudaMemcpy(out.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
        return out;
    }

private:
    T* p_ = nullptr;
    size_t n_;
};

// Restores the forward order when a test case ends.
struct RunOrder {
    explicit RunOrder(Order order, uint64_t seed = 1) { emulation::set_run_order(order, seed); }
    ~RunOrder() { emulation::set_run_order(Order::Forward); }
};

// Block sum of 256 ints through warp shuffles and shared memory, as kernels/cuda/launch.cuh does.
__global__ void block_sum_kernel(int* out, const int* in) {
    STARLING_SHARED(int, partial, [8]);
    int v = in[blockIdx.x * blockDim.x + threadIdx.x];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFull, v, offset);
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
        for (int w = 0; w < 8; w++) total += partial[w];
        out[blockIdx.x] = total;
    }
}

// The lines of the calls the faults below must name.
constexpr int kEarlyReturnBarrier = __LINE__ + 6;
constexpr int kFirstBarrier = __LINE__ + 11, kSecondBarrier = __LINE__ + 13;
constexpr int kExitedLaneShuffle = __LINE__ + 19;
constexpr int kFirstShuffle = __LINE__ + 24, kSecondShuffle = __LINE__ + 26;
__global__ void early_return_kernel(int* out) {
    if (threadIdx.x == 5) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void two_barriers_kernel(int* out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}

__global__ void exited_lane_kernel(int* out) {
    if (threadIdx.x == 31) return;
    out[threadIdx.x] = __shfl_xor_sync(kFull, int(threadIdx.x), 1);
}

__global__ void diverged_shuffle_kernel(int* out) {
    int v = int(threadIdx.x);
    if (threadIdx.x < 16) {
        v = __shfl_xor_sync(kFull, v, 1);
    } else {
        v = __shfl_xor_sync(kFull, v, 2);
    }
    out[threadIdx.x] = v;
}

__global__ void half_warp_sync_kernel(int* out) {
    // Lanes 0-15 and 16-31 synchronise as two separate groups: legal.
    __syncwarp(threadIdx.x % 32 < 16 ? 0x0000ffffu : 0xffff0000u);
    out[threadIdx.x] =
        __any_sync(kFull, threadIdx.x == 7) + __ballot_sync(kFull, threadIdx.x % 32 < 3);
}

__global__ void wrong_mask_kernel(int* out) {
    __syncwarp(0x1u);  // lane 0 alone, but every lane calls it
    out[threadIdx.x] = 1;
}

__global__ void read_shared_kernel(float* out) {
    STARLING_SHARED(float, s, [32]);
    out[threadIdx.x] = s[threadIdx.x];
}

__global__ void big_shared_kernel(float* out) {
    STARLING_SHARED(float, s, [13 * 1024]);  // 52 KiB: over the 48 KiB of static shared memory
    s[threadIdx.x] = 0.0f;
    out[threadIdx.x] = s[threadIdx.x];
}

__global__ void dynamic_shared_kernel(int* out) {
    STARLING_DYNAMIC_SHARED(int, s);
    s[threadIdx.x] = int(threadIdx.x) * 2;
    __syncthreads();
    out[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}

__global__ void atomic_min_kernel(int* out) {
    atomicMin(out, int(1000 - blockIdx.x * 32 - threadIdx.x));
}

__global__ void index_kernel(int* out) {
    const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const unsigned thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[block * blockDim.x * blockDim.y * blockDim.z + thread] = int(block * 1000 + thread);
}

namespace wmma = nvcuda::wmma;

// D = A B + C for one 16 x 16 x 16 tile, A row-major, B row- or column-major as the template says.
template <typename BLayout>
__global__ void mma_kernel(float* d, const __nv_bfloat16* a, const __nv_bfloat16* b,
                           const float* c) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, BLayout> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::load_matrix_sync(fc, c, 16, wmma::mem_row_major);
    wmma::mma_sync(fc, fa, fb, fc);
    wmma::store_matrix_sync(d, fc, 16, wmma::mem_row_major);
}

__global__ void misaligned_mma_kernel(float* d) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
    wmma::fill_fragment(fc, 1.0f);
    wmma::store_matrix_sync(d + 1, fc, 16, wmma::mem_row_major);
}

}  // namespace

TEST_CASE("a correct block sum gives the same result in every run order", "[emulation]") {
    std::vector<int> in(4 * 256);
    std::iota(in.begin(), in.end(), -300);
    const DeviceArray<int> input(in), sums(4);
    for (const Order order : {Order::Forward, Order::Reverse, Order::Shuffle}) {
        const RunOrder run(order, 42);
        launch<block_sum_kernel>(4, 256, 0, nullptr, sums.get(), input.get());
        REQUIRE(cudaGetLastError() == cudaSuccess);
        for (int b = 0; b < 4; b++) {
            const int want = std::accumulate(in.begin() + b * 256, in.begin() + (b + 1) * 256, 0);
            CHECK(sums.host()[size_t(b)] == want);
        }
    }
}

TEST_CASE("the built-in indices cover a 3-D grid of 3-D blocks exactly once", "[emulation]") {
    const dim3 grid(2, 3, 2), block(4, 2, 3);
    const size_t n = 12 * 24;
    const DeviceArray<int> out(n);
    launch<index_kernel>(grid, block, 0, nullptr, out.get());
    const std::vector<int> got = out.host();
    for (size_t b = 0; b < 12; b++) {
        for (size_t t = 0; t < 24; t++) CHECK(got[b * 24 + t] == int(b * 1000 + t));
    }
}

TEST_CASE("a missing barrier shows as a result that depends on the run order", "[emulation]") {
    const DeviceArray<int> out(64);
    std::vector<int> want(64);
    for (int t = 0; t < 64; t++) want[size_t(t)] = (t + 1) % 64;
    for (const Order order : {Order::Forward, Order::Reverse}) {
        const RunOrder run(order);
        launch<rotate_kernel<true>>(1, 64, 0, nullptr, out.get());
        CHECK(out.host() == want);
    }
    // Without it, the first thread to run reads its neighbour's slot before it is written: the
    // 0xff junk every shared variable starts as.
    const RunOrder run(Order::Forward);
    launch<rotate_kernel<false>>(1, 64, 0, nullptr, out.get());
    CHECK(out.host()[0] == -1);
    CHECK(out.host() != want);
}

TEST_CASE("two blocks writing one slot leave what the last block to run wrote", "[emulation]") {
    const DeviceArray<int> out(1);
    {
        const RunOrder run(Order::Forward);
        launch<same_slot_kernel>(8, 32, 0, nullptr, out.get());
        CHECK(out.host()[0] == 7);
    }
    const RunOrder run(Order::Reverse);
    launch<same_slot_kernel>(8, 32, 0, nullptr, out.get());
    CHECK(out.host()[0] == 0);
}

TEST_CASE(
    "__syncthreads skipped by a thread that returned is an error naming kernel, thread and line",
    "[emulation]") {
    const DeviceArray<int> out(64);
    REQUIRE_THROWS_MATCHES(
        launch<early_return_kernel>(1, 64, 0, nullptr, out.get()), KernelFault,
        Catch::Matchers::Message("kernel early_return_kernel, block (0,0,0), thread (0,0,0): "
                                 "__syncthreads at " +
                                 site(kEarlyReturnBarrier) +
                                 " is not reached by thread (5,0,0), which exited"));
}

TEST_CASE("__syncthreads at two call sites is an error naming both lines", "[emulation]") {
    const DeviceArray<int> out(64);
    REQUIRE_THROWS_WITH(launch<two_barriers_kernel>(1, 64, 0, nullptr, out.get()),
                        Contains("kernel two_barriers_kernel") &&
                            Contains("__syncthreads at " + site(kFirstBarrier)) &&
                            Contains("waits at __syncthreads at " + site(kSecondBarrier)));
}

TEST_CASE("a full-mask shuffle with an exited lane is an error", "[emulation]") {
    const DeviceArray<int> out(32);
    REQUIRE_THROWS_WITH(launch<exited_lane_kernel>(1, 32, 0, nullptr, out.get()),
                        Contains("kernel exited_lane_kernel") &&
                            Contains("__shfl_xor_sync at " + site(kExitedLaneShuffle)) &&
                            Contains("lane 31 of the mask exited"));
}

TEST_CASE("lanes waiting at different shuffles have diverged", "[emulation]") {
    const DeviceArray<int> out(32);
    REQUIRE_THROWS_WITH(
        launch<diverged_shuffle_kernel>(1, 32, 0, nullptr, out.get()),
        Contains("diverged") && Contains(site(kFirstShuffle)) && Contains(site(kSecondShuffle)));
}

TEST_CASE("warp votes and half-warp __syncwarp agree with hand-computed values", "[emulation]") {
    const DeviceArray<int> out(64);
    launch<half_warp_sync_kernel>(1, 64, 0, nullptr, out.get());
    // any(lane == 7) is 1 in the first warp only; ballot(lane < 3) is 0b111 in both warps.
    for (int t = 0; t < 64; t++) CHECK(out.host()[size_t(t)] == (t < 32 ? 1 : 0) + 7);
}

TEST_CASE("a collective whose mask leaves out the calling lane is an error", "[emulation]") {
    const DeviceArray<int> out(32);
    REQUIRE_THROWS_WITH(launch<wrong_mask_kernel>(1, 32, 0, nullptr, out.get()),
                        Contains("thread (1,0,0)") && Contains("mask 0x00000001") &&
                            Contains("does not name the calling lane 1"));
}

TEST_CASE("device and shared memory start as NaN until written", "[emulation]") {
    const DeviceArray<float> out(32);
    for (const float v : out.host()) CHECK(std::isnan(v));
    REQUIRE(cudaMemset(out.get(), 0, 32 * sizeof(float)) == cudaSuccess);
    for (const float v : out.host()) CHECK(v == 0.0f);
    launch<read_shared_kernel>(1, 32, 0, nullptr, out.get());
    for (const float v : out.host()) CHECK(std::isnan(v));
}

TEST_CASE("launch limits are a device's: block size, grid size, dynamic shared memory",
          "[emulation]") {
    const DeviceArray<int> out(2048);
    REQUIRE(cudaMemset(out.get(), 0, 2048 * sizeof(int)) == cudaSuccess);
    launch<dynamic_shared_kernel>(1, 1025, 0, nullptr, out.get());
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    launch<dynamic_shared_kernel>(dim3(1, 65536), 32, 0, nullptr, out.get());
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    launch<dynamic_shared_kernel>(1, dim3(1, 1, 65), 0, nullptr, out.get());
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    // Over the default 48 KiB of dynamic shared memory, refused until the kernel opts in.
    launch<dynamic_shared_kernel>(1, 64, 64 * 1024, nullptr, out.get());
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(out.host()[0] == 0);  // nothing ran
    CHECK(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               300 * 1024) == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    REQUIRE(cudaFuncSetAttribute(dynamic_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 64 * 1024) == cudaSuccess);
    launch<dynamic_shared_kernel>(1, 64, 64 * 1024, nullptr, out.get());
    REQUIRE(cudaGetLastError() == cudaSuccess);
    const std::vector<int> got = out.host();
    for (int t = 0; t < 64; t++) CHECK(got[size_t(t)] == (63 - t) * 2);
    // A stream that was destroyed cannot take work.
    cudaStream_t stream = nullptr;
    REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
    REQUIRE(cudaStreamDestroy(stream) == cudaSuccess);
    launch<dynamic_shared_kernel>(1, 64, 0, stream, out.get());
    CHECK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
}

TEST_CASE("static shared memory over 48 KiB is an error naming the kernel", "[emulation]") {
    const DeviceArray<float> out(32);
    REQUIRE_THROWS_WITH(launch<big_shared_kernel>(1, 32, 0, nullptr, out.get()),
                        Contains("kernel big_shared_kernel") && Contains("53248 static") &&
                            Contains("exceeds the block's limit of 49152"));
}

TEST_CASE("atomicMin from every thread of every block keeps the smallest value", "[emulation]") {
    const DeviceArray<int> out(std::vector<int>{1 << 30});
    launch<atomic_min_kernel>(4, 32, 0, nullptr, out.get());
    CHECK(out.host()[0] == 1000 - 3 * 32 - 31);
}

TEMPLATE_TEST_CASE("wmma::mma_sync multiplies bf16 tiles exactly, summing in fp32", "[emulation]",
                   wmma::row_major, wmma::col_major) {
    std::mt19937 random(3);
    std::uniform_real_distribution<float> value(-2.0f, 2.0f);
    std::vector<__nv_bfloat16> a(256), b(256);
    std::vector<float> c(256);
    for (auto& x : a) x = __float2bfloat16_rn(value(random));
    for (auto& x : b) x = __float2bfloat16_rn(value(random));
    for (auto& x : c) x = value(random);
    const DeviceArray<__nv_bfloat16> da(a), db(b);
    const DeviceArray<float> dc(c), dd(256);
    launch<mma_kernel<TestType>>(1, 32, 0, nullptr, dd.get(), da.get(), db.get(), dc.get());
    const bool b_row_major = std::is_same_v<TestType, wmma::row_major>;
    const std::vector<float> got = dd.host();
    for (int r = 0; r < 16; r++) {
        for (int n = 0; n < 16; n++) {
            double want = c[size_t(r * 16 + n)];
            for (int k = 0; k < 16; k++) {
                const float bk = float(b[size_t(b_row_major ? k * 16 + n : n * 16 + k)]);
                want += double(float(a[size_t(r * 16 + k)])) * double(bk);
            }
            // 17 fp32 additions of terms up to 4: within 17 * 2^-24 * 64 of the exact sum.
            CHECK(std::abs(got[size_t(r * 16 + n)] - want) <= 1e-4);
        }
    }
}

TEST_CASE("a WMMA tile that is not 32-byte aligned is an error", "[emulation]") {
    const DeviceArray<float> out(512);
    REQUIRE_THROWS_WITH(launch<misaligned_mma_kernel>(1, 32, 0, nullptr, out.get()),
                        Contains("wmma::store_matrix_sync: pointer not 32-byte aligned"));
}

TEST_CASE("cuBLAS rounds operands to TF32 in TF32 mode and takes bf16 exactly", "[emulation]") {
    cublasHandle_t handle = nullptr;
    REQUIRE(cublasCreate_v2(&handle) == CUBLAS_STATUS_SUCCESS);
    // 1 + 2^-11 + 2^-12 is 0.75 of a TF32 step (2^-10) above 1: it rounds up to 1 + 2^-10.
    const float x = 1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -12);
    const DeviceArray<float> a(std::vector<float>{x}), b(std::vector<float>{1.0f}), c(1);
    const float one = 1.0f, zero = 0.0f;
    REQUIRE(cublasSgemm_v2(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a.get(), 1, b.get(), 1,
                           &zero, c.get(), 1) == CUBLAS_STATUS_SUCCESS);
    CHECK(c.host()[0] == x);
    REQUIRE(cublasSetMathMode(handle, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasSgemm_v2(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a.get(), 1, b.get(), 1,
                           &zero, c.get(), 1) == CUBLAS_STATUS_SUCCESS);
    CHECK(c.host()[0] == 1.0f + std::ldexp(1.0f, -10));
    // bf16 1.5 (0x3fc0) times bf16 -2 (0xc000), into fp32.
    const DeviceArray<uint16_t> a16(std::vector<uint16_t>{0x3fc0}),
        b16(std::vector<uint16_t>{0xc000});
    REQUIRE(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, a16.get(), CUDA_R_16BF, 1,
                         b16.get(), CUDA_R_16BF, 1, &zero, c.get(), CUDA_R_32F, 1,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CHECK(c.host()[0] == -3.0f);
    // Host memory where device memory belongs is refused, not read.
    float host = 0.0f;
    CHECK(cublasSgemm_v2(handle, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, &host, 1, b.get(), 1,
                         &zero, c.get(), 1) == CUBLAS_STATUS_INVALID_VALUE);
    REQUIRE(cublasDestroy_v2(handle) == CUBLAS_STATUS_SUCCESS);
}

TEST_CASE("copies check that their device side lies inside an allocation", "[emulation]") {
    const DeviceArray<float> d(4);
    std::vector<float> host(8, 1.0f);
    CHECK(cudaMemcpy(d.get(), host.data(), 4 * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaSuccess);
    CHECK(cudaMemcpy(d.get(), host.data(), 8 * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaErrorInvalidValue);
    CHECK(cudaMemcpy(host.data(), d.get(), 4 * sizeof(float), cudaMemcpyHostToDevice) ==
          cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaFree(host.data()) == cudaErrorInvalidDevicePointer);
}
