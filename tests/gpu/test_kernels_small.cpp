// Every kernel of the CUDA backend once at a small shape, next to CpuOps<float> on the same inputs,
// in fp32 and bf16 matmul mode, for every attention head size the kernels are instantiated for.
// test_ops_cuda.cpp checks the same ops far more closely at many shapes; this case exists for the
// sanitized emulation builds (scripts/test-sanitized), where ThreadSanitizer makes every emulated
// thread a fiber of its own and the full-size shapes would take hours: here each kernel runs a few
// blocks, enough for every barrier, collective and tile boundary to be crossed.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/gpu/cuda_skip.h"
#include "tests/support/compare.h"
#include "tests/support/random.h"

using namespace starling;
using starling::cuda::CudaOps;
using starling::cuda::MatmulMath;

namespace {

// The same arrays on both backends.
class Both {
public:
    struct Array {
        float* cpu;
        float* gpu;
        size_t n;
    };

    Both(Ops<float>& cpu, Ops<float>& gpu) : cpu_(cpu), gpu_(gpu) {}
    ~Both() {
        for (const Array& a : arrays_) {
            cpu_.release(a.cpu);
            gpu_.release(a.gpu);
        }
    }
    Both(const Both&) = delete;
    Both& operator=(const Both&) = delete;

    Array random(size_t n, uint64_t seed, double lo = -1.0, double hi = 1.0) {
        Array a{cpu_.alloc(n), gpu_.alloc(n), n};
        const std::vector<float> values = test::random_vector<float>(n, seed, lo, hi);
        cpu_.from_host(a.cpu, values.data(), n);
        gpu_.from_host(a.gpu, values.data(), n);
        arrays_.push_back(a);
        return a;
    }

    Array zeros(size_t n) { return random(n, 0, 0.0, 0.0); }

    std::vector<float> host(Ops<float>& ops, const float* p, size_t n) {
        std::vector<float> out(n);
        ops.to_host(out.data(), p, n);
        return out;
    }

    void check(const std::string& what, const Array& a, double tolerance) {
        const double error = test::normalized_error(host(gpu_, a.gpu, a.n), host(cpu_, a.cpu, a.n));
        INFO(what << ": normalized error " << error);
        CHECK(error <= tolerance);
    }

private:
    Ops<float>& cpu_;
    Ops<float>& gpu_;
    std::vector<Array> arrays_;
};

}  // namespace

TEST_CASE("every CUDA kernel at a small shape agrees with the CPU", "[gpu][small]") {
    STARLING_SKIP_WITHOUT_CUDA();
    for (const MatmulMath math : {MatmulMath::Fp32, MatmulMath::Bf16}) {
        // bf16 rounds matmul and attention operands to 8 mantissa bits (test_ops_cuda.cpp says why
        // 3e-2 bounds it); fp32 differs from the CPU by summation order and FMAs only.
        const double tol = math == MatmulMath::Bf16 ? 3e-2 : 1e-4;
        for (const int hs : {16, 32, 64, 128}) {
            INFO("math " << int(math) << ", head size " << hs);
            CpuOps<float> cpu;
            CudaOps gpu(0, math);
            Both both(cpu, gpu);
            const int B = 2, T = 70, NH = 2, C = NH * hs, N = B * T, V = 50, F = 2 * C;
            auto on_both = [&](auto&& op) {
                op(static_cast<Ops<float>&>(cpu), [](const Both::Array& a) { return a.cpu; });
                op(static_cast<Ops<float>&>(gpu), [](const Both::Array& a) { return a.gpu; });
            };

            const auto x = both.random(size_t(N) * C, 1), w = both.random(size_t(3) * C * C, 2);
            const auto qkv = both.zeros(size_t(N) * 3 * C);
            on_both([&](Ops<float>& ops, auto at) {
                ops.matmul_forward(at(qkv), at(x), at(w), N, C, 3 * C, false);
            });
            both.check("matmul_forward", qkv, tol);
            const auto dqkv = both.random(size_t(N) * 3 * C, 3), dx = both.zeros(size_t(N) * C),
                       dw = both.zeros(size_t(3) * C * C);
            on_both([&](Ops<float>& ops, auto at) {
                ops.matmul_backward(at(dx), at(dw), at(dqkv), at(x), at(w), N, C, 3 * C, false);
            });
            both.check("matmul_backward dinp", dx, tol);
            both.check("matmul_backward dweight", dw, tol);

            // Attention on inputs of unit scale, as in a trained model, not on the product above,
            // whose large scores would make bf16's rounding of q and k swing the softmax.
            const auto q = both.random(size_t(N) * 3 * C, 11);
            on_both(
                [&](Ops<float>& ops, auto at) { ops.rope_forward(at(q), B, T, C, NH, 10000.0f); });
            both.check("rope_forward", q, 1e-5);
            const auto att = both.zeros(size_t(N) * C), lse = both.zeros(size_t(B) * NH * T);
            on_both([&](Ops<float>& ops, auto at) {
                ops.attention_forward(at(att), at(lse), at(q), B, T, C, NH);
            });
            both.check("attention_forward", att, tol);
            const auto datt = both.random(size_t(N) * C, 4), dq = both.zeros(size_t(N) * 3 * C);
            on_both([&](Ops<float>& ops, auto at) {
                ops.attention_backward(at(dq), at(datt), at(q), at(att), at(lse), B, T, C, NH);
                ops.rope_backward(at(dq), B, T, C, NH, 10000.0f);
            });
            both.check("attention_backward and rope_backward", dq, 2 * tol);

            const auto norm = both.zeros(size_t(N) * C), rstd = both.zeros(size_t(N)),
                       g = both.random(size_t(C), 5), dnorm = both.random(size_t(N) * C, 6),
                       dxn = both.zeros(size_t(N) * C), dg = both.zeros(size_t(C));
            on_both([&](Ops<float>& ops, auto at) {
                ops.rmsnorm_forward(at(norm), at(rstd), at(x), at(g), N, C, 1e-5f);
                ops.rmsnorm_backward(at(dxn), at(dg), at(dnorm), at(x), at(g), at(rstd), N, C);
            });
            both.check("rmsnorm_forward", norm, 1e-5);
            both.check("rmsnorm_backward dinp", dxn, 1e-5);
            both.check("rmsnorm_backward dweight", dg, 1e-5);

            const auto gu = both.random(size_t(N) * 2 * F, 7), h = both.zeros(size_t(N) * F),
                       dh = both.random(size_t(N) * F, 8), dgu = both.zeros(size_t(N) * 2 * F);
            on_both([&](Ops<float>& ops, auto at) {
                ops.swiglu_forward(at(h), at(gu), N, F);
                ops.swiglu_backward(at(dgu), at(dh), at(gu), N, F);
            });
            both.check("swiglu_forward", h, 1e-5);
            both.check("swiglu_backward", dgu, 1e-5);

            std::vector<int32_t> tokens(static_cast<size_t>(N), 0);
            for (int i = 0; i < N; i++) tokens[size_t(i)] = (i * 7 + hs) % V;
            int32_t* cpu_tokens = cpu.alloc_tokens(size_t(N));
            int32_t* gpu_tokens = gpu.alloc_tokens(size_t(N));
            cpu.tokens_from_host(cpu_tokens, tokens.data(), size_t(N));
            gpu.tokens_from_host(gpu_tokens, tokens.data(), size_t(N));
            const auto wte = both.random(size_t(V) * C, 9), emb = both.zeros(size_t(N) * C),
                       dwte = both.zeros(size_t(V) * C),
                       logits = both.random(size_t(N) * V, 10, -4, 4),
                       losses = both.zeros(size_t(N));
            cpu.embedding_forward(emb.cpu, cpu_tokens, wte.cpu, N, C);
            gpu.embedding_forward(emb.gpu, gpu_tokens, wte.gpu, N, C);
            cpu.embedding_backward(dwte.cpu, dnorm.cpu, cpu_tokens, N, C, V);
            gpu.embedding_backward(dwte.gpu, dnorm.gpu, gpu_tokens, N, C, V);
            cpu.crossentropy_forward(losses.cpu, logits.cpu, cpu_tokens, N, V);
            gpu.crossentropy_forward(losses.gpu, logits.gpu, gpu_tokens, N, V);
            both.check("embedding_forward", emb, 0.0);
            both.check("embedding_backward", dwte, 1e-6);
            both.check("crossentropy_forward", losses, 1e-5);
            cpu.crossentropy_backward(logits.cpu, logits.cpu, cpu_tokens, 0.5f, N, V);
            gpu.crossentropy_backward(logits.gpu, logits.gpu, gpu_tokens, 0.5f, N, V);
            both.check("crossentropy_backward in place", logits, 1e-5);
            cpu.release(cpu_tokens);
            gpu.release(gpu_tokens);

            CHECK(gpu.sum(x.gpu, x.n) == Approx(cpu.sum(x.cpu, x.n)).epsilon(1e-9));
            CHECK(gpu.sum_squares(x.gpu, x.n) == Approx(cpu.sum_squares(x.cpu, x.n)).epsilon(1e-9));
            const auto m = both.zeros(w.n), v = both.zeros(w.n);
            const AdamWScalars s{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.1f, 0.05f, 0.5f};
            on_both([&](Ops<float>& ops, auto at) {
                ops.scale(at(dw), 0.25f, dw.n);
                ops.adamw_update(at(w), at(m), at(v), at(dw), w.n, s);
            });
            both.check("adamw_update", w, tol);
        }
    }
}
