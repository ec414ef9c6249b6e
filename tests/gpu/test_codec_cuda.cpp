// CUDA element codecs (kernels/cuda/codec.cuh) against the CPU codecs (optimizer/codec/codec.h):
// encoded bytes, residuals and decoded values must match bit for bit. On a machine without a CUDA
// device (or without a driver) every test case warns "no CUDA device: ..." and returns early, so
// the suite passes while saying clearly that it checked nothing on a device.
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/codec.cuh"
#include "tests/gpu/cuda_skip.h"
#include "optimizer/codec/codec.h"
#include "tests/support/random.h"

using namespace starling;
using starling::codec::Codec;
using starling::test::random_vector;

namespace {

void cuda_ok(cudaError_t status, const char* what) {
    if (status != cudaSuccess) {
        FAIL(what << ": " << cudaGetErrorString(status));
    }
}

// A device array of T, filled from and read back to host vectors.
template <typename T>
class DeviceArray {
public:
    explicit DeviceArray(size_t n) : n_(n) {
        cuda_ok(cudaMalloc(reinterpret_cast<void**>(&ptr_), std::max<size_t>(n, 1) * sizeof(T)),
                "cudaMalloc");
    }
    explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) {
        cuda_ok(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice),
                "cudaMemcpy to device");
    }
    ~DeviceArray() {
        (void)cudaFree(ptr_);
    }
    DeviceArray(const DeviceArray&) = delete;
    DeviceArray& operator=(const DeviceArray&) = delete;

    T* get() {
        return ptr_;
    }
    std::vector<T> read() const {
        std::vector<T> host(n_);
        cuda_ok(cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost),
                "cudaMemcpy to host");
        return host;
    }

private:
    size_t n_;
    T* ptr_ = nullptr;
};

template <typename A, typename B>
bool same_bits(const std::vector<A>& a, const std::vector<B>& b) {
    return a.size() * sizeof(A) == b.size() * sizeof(B) &&
           std::memcmp(a.data(), b.data(), a.size() * sizeof(A)) == 0;
}

// The index of the first differing element (a.size() when none), for the failure message.
size_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
    for (size_t i = 0; i < a.size() && i < b.size(); i++) {
        if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) {
            return i;
        }
    }
    return a.size();
}

// theta and phi of a delta-like pair (phi a small step away from theta), with blocks of special
// values: all zero, subnormal, huge, exact multiples of a power of two.
struct DeltaPair {
    std::vector<float> theta;
    std::vector<float> phi;
};

DeltaPair delta_pair(size_t n, uint64_t seed) {
    DeltaPair p;
    p.theta = random_vector<float>(n, seed, -0.5, 0.5);
    const std::vector<float> step = random_vector<float>(n, seed + 1, -1e-3, 1e-3);
    p.phi.resize(n);
    for (size_t i = 0; i < n; i++) {
        p.phi[i] = p.theta[i] - step[i];
    }
    for (size_t i = 64; i < std::min<size_t>(n, 128); i++) {  // block 1: theta == phi
        p.phi[i] = p.theta[i];
    }
    for (size_t i = 128; i < std::min<size_t>(n, 192); i++) {  // block 2: subnormal deltas
        p.theta[i] = float(double(step[i]) * 1e-35);
        p.phi[i] = 0.0f;
    }
    for (size_t i = 192; i < std::min<size_t>(n, 256); i++) {  // block 3: huge deltas
        p.theta[i] = float(double(step[i]) * 1e41);
        p.phi[i] = 0.0f;
    }
    for (size_t i = 256; i < std::min<size_t>(n, 320); i++) {  // block 4: multiples of 2^-10
        p.theta[i] = std::ldexp(float(int(i % 255) - 127), -10);
        p.phi[i] = 0.0f;
    }
    return p;
}

std::vector<float> host_delta(const DeltaPair& p) {
    std::vector<float> d(p.theta.size());
    for (size_t i = 0; i < d.size(); i++) {
        d[i] = p.theta[i] - p.phi[i];
    }
    return d;
}

const size_t kSizes[] = {1, 7, 63, 64, 65, 127, 1001, 4099, 70001};
// Multiples of 64, the last past 2^35 so the Philox counter's high group word is non-zero.
const uint64_t kFirstIndices[] = {0, 64 * 37, (uint64_t(1) << 35) + 64 * 5};

}  // namespace

TEST_CASE("cuda_device_count never throws and is never negative", "[gpu]") {
    std::string reason;
    int count = -1;
    REQUIRE_NOTHROW(count = starling::cuda::cuda_device_count(&reason));
    CHECK(count >= 0);
    if (count == 0) {
        WARN("no CUDA device: " << reason << " (the device tests below are skipped)");
    }
}

TEST_CASE("CUDA Q8/Q4 encode of theta - phi matches the CPU bit for bit", "[gpu]") {
    STARLING_SKIP_WITHOUT_CUDA();
    const starling::codec::RoundingKey key{0x1234abcdULL, 77, 5};
    for (const int qmax : {127, 7}) {
        const Codec c = qmax == 127 ? Codec::Q8 : Codec::Q4;
        for (const size_t n : kSizes) {
            for (const uint64_t first : kFirstIndices) {
                CAPTURE(qmax, n, first);
                const DeltaPair p = delta_pair(n, 1000 + n);
                const std::vector<float> delta = host_delta(p);
                const size_t bytes = codec::encoded_bytes(c, n);
                DeviceArray<float> theta(p.theta);
                DeviceArray<float> phi(p.phi);

                // Without feedback.
                std::vector<std::byte> cpu(bytes);
                codec::encode(c, delta, first, key, cpu);
                DeviceArray<std::byte> out(bytes);
                starling::cuda::encode_q8_delta(out.get(), nullptr, theta.get(), phi.get(), n,
                                                first, key.node_id, key.round, key.stream, qmax);
                REQUIRE(same_bits(out.read(), cpu));

                // With feedback: bytes and the updated residual.
                std::vector<float> residual = random_vector<float>(n, 7 + n, -1e-4, 1e-4);
                DeviceArray<float> residual_dev(residual);
                std::vector<std::byte> cpu_fb(bytes);
                codec::encode_with_feedback(c, delta, residual, first, key, cpu_fb);
                DeviceArray<std::byte> out_fb(bytes);
                starling::cuda::encode_q8_delta(out_fb.get(), residual_dev.get(), theta.get(),
                                                phi.get(), n, first, key.node_id, key.round,
                                                key.stream, qmax);
                REQUIRE(same_bits(out_fb.read(), cpu_fb));
                const std::vector<float> gpu_residual = residual_dev.read();
                INFO("first differing residual: " << first_difference(gpu_residual, residual));
                REQUIRE(same_bits(gpu_residual, residual));

                // Decode of the same bytes.
                std::vector<float> cpu_decoded(n);
                codec::decode(c, cpu_fb, cpu_decoded);
                DeviceArray<float> decoded(n);
                starling::cuda::decode_q(decoded.get(), out_fb.get(), n, qmax);
                const std::vector<float> gpu_decoded = decoded.read();
                INFO("first differing value: " << first_difference(gpu_decoded, cpu_decoded));
                REQUIRE(same_bits(gpu_decoded, cpu_decoded));
            }
        }
    }
}

TEST_CASE("CUDA Q8/Q4 encode of a block with a NaN or Inf throws like the CPU", "[gpu]") {
    STARLING_SKIP_WITHOUT_CUDA();
    const starling::codec::RoundingKey key{3, 4, 5};
    for (const int qmax : {127, 7}) {
        const Codec c = qmax == 127 ? Codec::Q8 : Codec::Q4;
        const size_t n = 300;
        DeltaPair p = delta_pair(n, 42);
        p.theta[200] = std::numeric_limits<float>::quiet_NaN();
        p.theta[290] = std::numeric_limits<float>::infinity();
        const std::vector<float> delta = host_delta(p);
        std::vector<std::byte> cpu(codec::encoded_bytes(c, n));
        std::string cpu_message;
        try {
            codec::encode(c, delta, 128, key, cpu);
        } catch (const Error& e) {
            cpu_message = e.what();
        }
        REQUIRE_FALSE(cpu_message.empty());
        DeviceArray<float> theta(p.theta);
        DeviceArray<float> phi(p.phi);
        DeviceArray<std::byte> out(cpu.size());
        std::string gpu_message;
        try {
            starling::cuda::encode_q8_delta(out.get(), nullptr, theta.get(), phi.get(), n, 128,
                                            key.node_id, key.round, key.stream, qmax);
        } catch (const Error& e) {
            gpu_message = e.what();
        }
        CHECK(gpu_message == cpu_message);
    }
}

TEST_CASE("CUDA Q8/Q4 decode rejects what the CPU rejects, with the same message", "[gpu]") {
    STARLING_SKIP_WITHOUT_CUDA();
    const starling::codec::RoundingKey key{9, 9, 9};
    for (const int qmax : {127, 7}) {
        const Codec c = qmax == 127 ? Codec::Q8 : Codec::Q4;
        const size_t n = 64 * 3 + 5;  // odd last block: Q4 has a padding nibble
        const std::vector<float> x = random_vector<float>(n, 11, -1.0, 1.0);
        std::vector<std::byte> good(codec::encoded_bytes(c, n));
        codec::encode(c, x, 0, key, good);
        const size_t block = qmax == 127 ? 68 : 36;
        std::vector<std::vector<std::byte>> corrupt;
        {
            auto bad = good;  // NaN scale in block 1
            const float nan = std::numeric_limits<float>::quiet_NaN();
            std::memcpy(bad.data() + block, &nan, 4);
            corrupt.push_back(bad);
        }
        {
            auto bad = good;  // negative scale in block 2
            const float neg = -1.0f;
            std::memcpy(bad.data() + 2 * block, &neg, 4);
            corrupt.push_back(bad);
        }
        {
            auto bad = good;  // level -128 / -8 in block 0
            bad[4 + 3] = std::byte(qmax == 127 ? 0x80 : 0x08);
            corrupt.push_back(bad);
        }
        if (qmax == 7) {
            auto bad = good;  // padding nibble of the last (odd) block
            bad.back() = std::byte(uint8_t(bad.back()) | 0x10);
            corrupt.push_back(bad);
        }
        for (size_t k = 0; k < corrupt.size(); k++) {
            CAPTURE(qmax, k);
            std::vector<float> cpu_out(n);
            std::string cpu_message;
            try {
                codec::decode(c, corrupt[k], cpu_out);
            } catch (const Error& e) {
                cpu_message = e.what();
            }
            REQUIRE_FALSE(cpu_message.empty());
            DeviceArray<std::byte> in(corrupt[k]);
            DeviceArray<float> out(n);
            std::string gpu_message;
            try {
                starling::cuda::decode_q(out.get(), in.get(), n, qmax);
            } catch (const Error& e) {
                gpu_message = e.what();
            }
            CHECK(gpu_message == cpu_message);
        }
    }
}

TEST_CASE("CUDA BF16SR encode and decode match the CPU bit for bit", "[gpu]") {
    STARLING_SKIP_WITHOUT_CUDA();
    const starling::codec::RoundingKey key{0xfeedULL, 123456789012ULL, 2};
    const uint64_t firsts[] = {0, 3, 64 * 5 + 5, (uint64_t(1) << 35) - 3};
    for (const size_t n : kSizes) {
        for (const uint64_t first : firsts) {
            CAPTURE(n, first);
            std::vector<float> x = random_vector<float>(n, 500 + n, -3.0, 3.0);
            const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                                      -std::numeric_limits<float>::infinity(),
                                      FLT_MAX,
                                      -FLT_MAX,
                                      std::numeric_limits<float>::denorm_min(),
                                      0.0f,
                                      -0.0f,
                                      std::bit_cast<float>(0xff812345u)};  // a signalling NaN
            for (size_t i = 0; i < std::size(specials) && 3 * i < n; i++) {
                x[3 * i] = specials[i];
            }
            std::vector<std::byte> cpu(codec::encoded_bytes(Codec::BF16SR, n));
            codec::encode(Codec::BF16SR, x, first, key, cpu);
            DeviceArray<float> x_dev(x);
            DeviceArray<uint16_t> out(n);
            starling::cuda::encode_bf16sr(out.get(), x_dev.get(), n, first, key.node_id, key.round,
                                          key.stream);
            const std::vector<uint16_t> gpu = out.read();
            REQUIRE(same_bits(gpu, cpu));

            std::vector<float> cpu_decoded(n);
            codec::decode(Codec::BF16SR, cpu, cpu_decoded);
            DeviceArray<float> decoded(n);
            starling::cuda::decode_bf16(decoded.get(), out.get(), n);
            REQUIRE(same_bits(decoded.read(), cpu_decoded));
        }
    }
}
