// CudaOps (kernels/cuda/cuda_ops.h) against the CPU backend, op by op and over a short training
// run.
//
// Every op of kernels/ops.h runs on the GPU and on CpuOps<double> with the same random inputs
// (fp32 values, widened to double for the reference), so the reference is exact to double rounding
// and what is measured is the GPU's own fp32 arithmetic. One error measure serves every op,
// max|gpu - ref| / max|ref| (normalized_error below), against a tolerance per kind of op, stated
// with its reasoning below. Outputs an op accumulates into start non-zero, and outputs it
// overwrites start with junk, so both behaviours are checked. Then: the errors the backend must
// report (bad targets and tokens, head sizes over 128, a device that does not exist), memory
// accounting, and 20 AdamW steps of a small model on both backends, with per-step losses and final
// weights compared, plus bit-identical results over two GPU runs (the backend uses no float
// atomics).
//
// On a machine without a CUDA device (or without a driver) every test case warns "no CUDA device:
// ..." and returns early, so the suite passes while saying clearly that it checked nothing.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cuda/cuda_ops.h"
#include "tests/gpu/cuda_skip.h"
#include "model/config.h"
#include "model/model.h"
#include "optimizer/adamw.h"
#include "tests/support/random.h"

using namespace starling;
using starling::cuda::CudaOps;
using starling::cuda::MatmulMath;
using starling::test::as_double;
using starling::test::random_vector;

namespace {

// Tolerances on normalized_error against the double reference; fp32 rounds at 2^-24 = 6e-8. The
// figures "measured" are CpuOps<float> against the same reference on the same inputs: another fp32
// implementation, so what an honest GPU should come close to.
//
// Copies, gathers and fills move bits and round nothing.
constexpr double kExact = 0.0;
// scale is one fp32 multiply per element: at most 2^-24 relative to the element, so to the maximum.
constexpr double kOneRounding = 1e-6;
// A handful of fp32 roundings per element plus exp, sqrt, sin or cos within a few ulp (rmsnorm,
// rope, swiglu, embedding scatter sums, crossentropy, adamw): measured at most 4e-7. Row
// reductions inside these ops (rmsnorm's sums of squares, crossentropy's sum of exponentials) are
// in double on the CPU; an fp32 tree sum there would still be within about log2(V) * 2^-24 = 1e-6.
// 1e-5 leaves a 10x margin for FMA contraction and CUDA's own exp.
constexpr double kElementwise = 1e-5;
// fp32 matmuls: each output is a dot product of up to 4096 random-sign terms. Its rounding error
// grows like sqrt(K) * 2^-24 times a typical term for blocked sums like cuBLAS's, and the result
// itself like sqrt(K) times a term, so the normalized error stays near 1e-7..1e-6 whatever K
// (measured at most 6e-7 on these shapes). TF32 would give ~1e-3, so this bound also proves that
// MatmulMath::Fp32 does not use TF32 tensor cores.
constexpr double kMatmul = 1e-5;
// TF32 rounds both inputs of each product to a 10-bit mantissa (relative error up to 2^-11
// rounded, 2^-10 truncated), so a product is off by up to ~2e-3 of itself. Over a random-sign dot
// product those errors add up like the products do (sqrt(K) growth on both sides), which leaves
// ~1e-3 of the largest output; 1e-2 is a 10x margin, still far below what a wrong result gives.
constexpr double kTf32 = 1e-2;
// Bf16 rounds both operands stochastically to an 8-bit mantissa: each is off by less than one bf16
// step (2^-7 of its magnitude at most, about 2^-9 on average), so a product is off by ~4e-3 of
// itself, random in sign; as for TF32 the normalized error of a dot product stays near that,
// ~5e-3. 3e-2 keeps a margin and still fails any wrong layout or transpose.
constexpr double kBf16 = 3e-2;
// Attention chains a dot product over hs, a softmax with exp over up to 257 scores and a dot
// product over T, and the backward subtracts D_i = dO_i . O_i from dP_ij (a cancellation), then
// sums over T again; an online (flash) softmax also rescales partial sums as the running maximum
// moves, and keeps D_i in fp32. Measured at most 9e-7; 1e-4 allows for the longer fp32 chain.
constexpr double kAttention = 1e-4;
// In Bf16 mode attention's products run on tensor cores with q, k, v, dO, P and dS rounded to bf16
// (statistics in fp32): rounding the inputs alone to bf16 moves a double-precision reference by up
// to 6e-3 on these shapes, so 2e-2 leaves a margin and still fails any wrong tile or mask.
constexpr double kAttentionBf16 = 2e-2;

using HostArrays = std::vector<std::vector<float>>;

double max_abs(const std::vector<double>& x) {
    double m = 0.0;
    for (const double v : x) {
        m = std::max(m, std::abs(v));
    }
    return m;
}

// max|got - ref| / max|ref|, with the scale floored at scale_floor (by default 1e-30, so an
// all-zero reference still compares, exactly). A NaN in either array is an infinite error, where
// std::max would quietly drop it.
double normalized_error(const std::vector<double>& got, const std::vector<double>& ref,
                        double scale_floor) {
    double diff = 0.0;
    for (size_t i = 0; i < ref.size(); i++) {
        const double d = std::abs(got[i] - ref[i]);
        if (std::isnan(d)) {
            return std::numeric_limits<double>::infinity();
        }
        diff = std::max(diff, d);
    }
    return diff / std::max(max_abs(ref), scale_floor);
}

void check_close(const std::string& what, const std::vector<double>& got,
                 const std::vector<double>& ref, double tolerance, double scale_floor = 1e-30) {
    REQUIRE(got.size() == ref.size());
    const double error = normalized_error(got, ref, scale_floor);
    INFO(what << ": normalized error " << error << ", tolerance " << tolerance);
    CHECK(error <= tolerance);
}

template <typename A, typename B>
bool same_bits(const std::vector<A>& a, const std::vector<B>& b) {
    return a.size() * sizeof(A) == b.size() * sizeof(B) &&
           std::memcmp(a.data(), b.data(), a.size() * sizeof(A)) == 0;
}

// The message of the starling::Error that f() throws, or "" when it throws none.
template <typename F>
std::string error_message(const F& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "";
}

// Arrays in one backend's memory, uploaded from fp32 host arrays (converted to R), plus one token
// array; all released on destruction, so an op that throws leaks nothing.
template <typename R>
class BackendArrays {
public:
    BackendArrays(Ops<R>& ops, const HostArrays& host, const std::vector<int32_t>& tokens)
        : ops_(ops) {
        for (const std::vector<float>& h : host) {
            // An empty array still gets one element: alloc(0) is no part of what is tested here.
            ptrs_.push_back(ops_.alloc(std::max<size_t>(h.size(), 1)));
            sizes_.push_back(h.size());
            if (!h.empty()) {
                const std::vector<R> converted(h.begin(), h.end());
                ops_.from_host(ptrs_.back(), converted.data(), h.size());
            }
        }
        tokens_ = ops_.alloc_tokens(std::max<size_t>(tokens.size(), 1));
        if (!tokens.empty()) {
            ops_.tokens_from_host(tokens_, tokens.data(), tokens.size());
        }
    }
    ~BackendArrays() {
        for (R* p : ptrs_) {
            ops_.release(p);
        }
        ops_.release(tokens_);
    }
    BackendArrays(const BackendArrays&) = delete;
    BackendArrays& operator=(const BackendArrays&) = delete;

    std::vector<R*>& ptrs() { return ptrs_; }
    int32_t* tokens() { return tokens_; }
    std::vector<double> read(size_t i) {
        std::vector<R> host(sizes_[i]);
        if (!host.empty()) {
            ops_.to_host(host.data(), ptrs_[i], host.size());
        }
        return std::vector<double>(host.begin(), host.end());
    }

private:
    Ops<R>& ops_;
    std::vector<R*> ptrs_;
    std::vector<size_t> sizes_;
    int32_t* tokens_ = nullptr;
};

// Uploads the arrays and tokens to `ops`, runs op(ops, pointers, tokens) and reads every array
// back (inputs too, so in-place and accumulating ops are checked like the others). op is a generic
// lambda so the same call runs on Ops<float> and Ops<double>.
template <typename R, typename Op>
std::vector<std::vector<double>> run_op(Ops<R>& ops, const HostArrays& arrays,
                                        const std::vector<int32_t>& tokens, const Op& op) {
    BackendArrays<R> backend(ops, arrays, tokens);
    op(ops, backend.ptrs(), backend.tokens());
    std::vector<std::vector<double>> out;
    for (size_t i = 0; i < arrays.size(); i++) {
        out.push_back(backend.read(i));
    }
    return out;
}

struct Results {
    std::vector<std::vector<double>> gpu;
    std::vector<std::vector<double>> ref;
};

// The same op on the GPU and on the CPU reference in double.
template <typename Op>
Results run_both(Ops<float>& gpu, const HostArrays& arrays, const std::vector<int32_t>& tokens,
                 const Op& op) {
    CpuOps<double> ref;
    return Results{run_op(gpu, arrays, tokens, op), run_op(ref, arrays, tokens, op)};
}

// n tokens in [0, distinct) with the vocabulary's last token V - 1 at the front, so the largest
// row offset is exercised; a small `distinct` makes many rows share a token.
std::vector<int32_t> random_tokens(size_t n, int distinct, int V, uint64_t seed) {
    const std::vector<double> u = random_vector<double>(n, seed, 0.0, double(distinct));
    std::vector<int32_t> tokens(n);
    for (size_t i = 0; i < n; i++) {
        tokens[i] = std::min(int32_t(u[i]), int32_t(distinct - 1));
    }
    if (n > 0) {
        tokens[0] = V - 1;
    }
    return tokens;
}

// One third (0 q, 1 k, 2 v) of a (rows, 3C) array, so each part of dqkv is compared against its
// own scale rather than against the largest of the three.
std::vector<double> qkv_part(const std::vector<double>& x, int C, int part) {
    std::vector<double> out;
    for (size_t row = 0; row < x.size() / (3 * size_t(C)); row++) {
        const auto first = x.begin() + std::ptrdiff_t(row * 3 * C + size_t(part) * C);
        out.insert(out.end(), first, first + C);
    }
    return out;
}

// dlogits (N,V) with each row's target entry set to 0. What is left is softmax * dloss, entries of
// about dloss / V that a single normalized error would measure against the -dloss at the targets.
std::vector<double> without_targets(std::vector<double> x, const std::vector<int32_t>& targets,
                                    int V) {
    for (size_t n = 0; n < targets.size(); n++) {
        x[n * V + size_t(targets[n])] = 0.0;
    }
    return x;
}

struct MatmulShape {
    int N, IC, OC;
};
// Degenerate, odd, tile-sized and long-K shapes (K = IC forward, OC and N in the backward).
const MatmulShape kMatmulShapes[] = {{1, 1, 1},       {7, 13, 5},     {64, 64, 192},
                                     {100, 1000, 70}, {256, 176, 64}, {33, 4096, 9}};

double matmul_tolerance(MatmulMath math) {
    switch (math) {
        case MatmulMath::Fp32: return kMatmul;
        case MatmulMath::Tf32: return kTf32;
        case MatmulMath::Bf16: return kBf16;
    }
    return 0.0;
}

// Head sizes from small to the kernel's largest, 24 not a power of two, and sequence lengths on
// and off multiples of 64 (attention's tiles).
const int kHeadSizes[] = {16, 24, 64, 128};
const int kSeqLens[] = {1, 7, 64, 100, 257};

}  // namespace

TEST_CASE("cuda_device_count never throws and is never negative", "[gpu]") {
    std::string reason;
    int count = -1;
    REQUIRE_NOTHROW(count = starling::cuda::cuda_device_count(&reason));
    CHECK(count >= 0);
    if (count == 0) WARN("no CUDA device: " << reason << " (the device tests below are skipped)");
}

TEST_CASE("CUDA matmul_forward matches the CPU, overwriting or accumulating, in each precision",
          "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    for (const MatmulMath math : {MatmulMath::Fp32, MatmulMath::Tf32, MatmulMath::Bf16}) {
        CudaOps gpu(0, math);
        for (const MatmulShape& s : kMatmulShapes) {
            for (const bool accumulate : {false, true}) {
                CAPTURE(int(math), s.N, s.IC, s.OC, accumulate);
                // out starts as junk to overwrite, or as the addend.
                const HostArrays arrays = {random_vector<float>(size_t(s.N) * s.OC, 1),
                                           random_vector<float>(size_t(s.N) * s.IC, 2),
                                           random_vector<float>(size_t(s.OC) * s.IC, 3)};
                const Results r = run_both(gpu, arrays, {}, [&](auto& o, auto& a, int32_t*) {
                    o.matmul_forward(a[0], a[1], a[2], s.N, s.IC, s.OC, accumulate);
                });
                check_close("out", r.gpu[0], r.ref[0], matmul_tolerance(math));
            }
        }
    }
}

TEST_CASE("CUDA matmul_backward matches the CPU with dinp overwritten, accumulated or null",
          "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    enum class Dinp { Overwrite, Accumulate, Null };
    for (const MatmulMath math : {MatmulMath::Fp32, MatmulMath::Tf32, MatmulMath::Bf16}) {
        CudaOps gpu(0, math);
        for (const MatmulShape& s : kMatmulShapes) {
            for (const Dinp mode : {Dinp::Overwrite, Dinp::Accumulate, Dinp::Null}) {
                CAPTURE(int(math), s.N, s.IC, s.OC, int(mode));
                // dinp starts as junk or as the addend (or must stay untouched); dweight always
                // accumulates, so it starts non-zero.
                const HostArrays arrays = {random_vector<float>(size_t(s.N) * s.IC, 4),
                                           random_vector<float>(size_t(s.OC) * s.IC, 5),
                                           random_vector<float>(size_t(s.N) * s.OC, 6),
                                           random_vector<float>(size_t(s.N) * s.IC, 7),
                                           random_vector<float>(size_t(s.OC) * s.IC, 8)};
                const Results r = run_both(gpu, arrays, {}, [&](auto& o, auto& a, int32_t*) {
                    o.matmul_backward(mode == Dinp::Null ? nullptr : a[0], a[1], a[2], a[3], a[4],
                                      s.N, s.IC, s.OC, mode == Dinp::Accumulate);
                });
                check_close("dinp", r.gpu[0], r.ref[0],
                            mode == Dinp::Null ? kExact : matmul_tolerance(math));
                check_close("dweight", r.gpu[1], r.ref[1], matmul_tolerance(math));
            }
        }
    }
}

TEST_CASE("CUDA rmsnorm forward and backward match the CPU, the backward accumulating",
          "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    struct Shape {
        int N, C;
    };
    // 300 rows span three of the backward's 128-row dweight chunks, the last one partial.
    for (const Shape s : {Shape{1, 7}, Shape{7, 64}, Shape{64, 24}, Shape{100, 1000},
                          Shape{33, 4096}, Shape{300, 96}}) {
        CAPTURE(s.N, s.C);
        const size_t nc = size_t(s.N) * s.C;
        // out and rstd start as junk; dinp and dweight start non-zero to check accumulation.
        const HostArrays arrays = {random_vector<float>(nc, 10),
                                   random_vector<float>(size_t(s.N), 11),
                                   random_vector<float>(nc, 12, -2.0, 2.0),          // inp
                                   random_vector<float>(size_t(s.C), 13, 0.5, 1.5),  // weight
                                   random_vector<float>(nc, 14),                     // dout
                                   random_vector<float>(nc, 15),                     // dinp
                                   random_vector<float>(size_t(s.C), 16)};           // dweight
        const Results r = run_both(gpu, arrays, {}, [&](auto& o, auto& a, int32_t*) {
            o.rmsnorm_forward(a[0], a[1], a[2], a[3], s.N, s.C, 1e-5f);
            o.rmsnorm_backward(a[5], a[6], a[4], a[2], a[3], a[1], s.N, s.C);
        });
        check_close("out", r.gpu[0], r.ref[0], kElementwise);
        check_close("rstd", r.gpu[1], r.ref[1], kElementwise);
        check_close("dinp", r.gpu[5], r.ref[5], kElementwise);
        check_close("dweight", r.gpu[6], r.ref[6], kElementwise);
    }
}

TEST_CASE("CUDA rope forward and backward match the CPU, at long positions too", "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    const int B = 2, NH = 3;
    for (const int hs : kHeadSizes) {
        // 1024: the angle t * theta^(-2j/hs) must be formed in double as on the CPU; in fp32 it
        // would be off by up to t * 2^-24 radians, 6e-5 at t = 1023, beyond kElementwise.
        for (const int T : {1, 7, 100, 257, 1024}) {
            CAPTURE(hs, T);
            const int C = NH * hs;
            const size_t n = size_t(B) * T * 3 * C;
            const HostArrays arrays = {random_vector<float>(n, 20, -2.0, 2.0),
                                       random_vector<float>(n, 21, -2.0, 2.0)};
            const Results r = run_both(gpu, arrays, {}, [&](auto& o, auto& a, int32_t*) {
                o.rope_forward(a[0], B, T, C, NH, 10000.0f);
                o.rope_backward(a[1], B, T, C, NH, 10000.0f);
            });
            check_close("rope_forward", r.gpu[0], r.ref[0], kElementwise);
            check_close("rope_backward", r.gpu[1], r.ref[1], kElementwise);
            // Only q and k rotate: the v third must come back untouched.
            check_close("v after rope_forward", qkv_part(r.gpu[0], C, 2), qkv_part(r.ref[0], C, 2),
                        kExact);
            check_close("v after rope_backward", qkv_part(r.gpu[1], C, 2), qkv_part(r.ref[1], C, 2),
                        kExact);
        }
    }
}

TEST_CASE("CUDA attention forward and backward match the CPU for head sizes 16..128",
          "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    const int B = 2, NH = 3;  // six (batch, head) pairs
    for (const MatmulMath math : {MatmulMath::Fp32, MatmulMath::Bf16}) {
        CudaOps gpu(0, math);
        const double tolerance = math == MatmulMath::Bf16 ? kAttentionBf16 : kAttention;
        for (const int hs : kHeadSizes) {
            for (const int T : kSeqLens) {
                CAPTURE(int(math), hs, T);
                const int C = NH * hs;
                const size_t n = size_t(B) * T * C;
                // Scores q.k / sqrt(hs) with q, k in [-2, 2) have a spread of about 1.3:
                // softmax rows are neither uniform nor one-hot. out, lse and dqkv start as junk.
                const HostArrays arrays = {random_vector<float>(3 * n, 30, -2.0, 2.0),    // qkv
                                           random_vector<float>(n, 31),                   // out
                                           random_vector<float>(size_t(B) * NH * T, 32),  // lse
                                           random_vector<float>(n, 33),                   // dout
                                           random_vector<float>(3 * n, 34)};              // dqkv
                const Results r = run_both(gpu, arrays, {}, [&](auto& o, auto& a, int32_t*) {
                    o.attention_forward(a[1], a[2], a[0], B, T, C, NH);
                    o.attention_backward(a[4], a[3], a[0], a[1], a[2], B, T, C, NH);
                });
                check_close("out", r.gpu[1], r.ref[1], tolerance);
                check_close("lse", r.gpu[2], r.ref[2], tolerance);
                const std::vector<double> dv = qkv_part(r.ref[4], C, 2);
                // With one key (T = 1) the softmax is the constant 1, so dq and dk are exactly zero
                // and both backends return only the rounding left by dP - D: that is measured
                // against the scale of dv, the gradient the same terms make.
                const double dqk_floor = T == 1 ? max_abs(dv) : 1e-30;
                check_close("dq", qkv_part(r.gpu[4], C, 0), qkv_part(r.ref[4], C, 0), tolerance,
                            dqk_floor);
                check_close("dk", qkv_part(r.gpu[4], C, 1), qkv_part(r.ref[4], C, 1), tolerance,
                            dqk_floor);
                check_close("dv", qkv_part(r.gpu[4], C, 2), dv, tolerance);
            }
        }
    }
}

TEST_CASE("CUDA swiglu forward and backward match the CPU", "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    struct Shape {
        int N, F;
    };
    for (const Shape s : {Shape{1, 1}, Shape{7, 176}, Shape{100, 1000}, Shape{3, 5003}}) {
        CAPTURE(s.N, s.F);
        const size_t nf = size_t(s.N) * s.F;
        // Gates in [-6, 6) reach both tails of silu. out and dgu start as junk.
        const HostArrays arrays = {random_vector<float>(nf, 40),
                                   random_vector<float>(2 * nf, 41, -6.0, 6.0),  // gu
                                   random_vector<float>(nf, 42),                 // dout
                                   random_vector<float>(2 * nf, 43)};            // dgu
        const Results r = run_both(gpu, arrays, {}, [&](auto& o, auto& a, int32_t*) {
            o.swiglu_forward(a[0], a[1], s.N, s.F);
            o.swiglu_backward(a[3], a[2], a[1], s.N, s.F);
        });
        check_close("out", r.gpu[0], r.ref[0], kElementwise);
        check_close("dgu", r.gpu[3], r.ref[3], kElementwise);
    }
}

TEST_CASE("CUDA embedding forward is an exact gather, backward accumulates repeated tokens",
          "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    struct Case {
        int N, C, V, distinct;  // tokens drawn from [0, distinct), plus V - 1
    };
    for (const Case c : {Case{1, 1, 1, 1}, Case{1000, 7, 3, 3}, Case{300, 64, 1000, 10},
                         Case{256, 100, 50257, 50257}}) {
        CAPTURE(c.N, c.C, c.V, c.distinct);
        const std::vector<int32_t> tokens = random_tokens(size_t(c.N), c.distinct, c.V, 50);
        // out starts as junk; dwte starts non-zero to check accumulation.
        const HostArrays arrays = {random_vector<float>(size_t(c.N) * c.C, 51),
                                   random_vector<float>(size_t(c.V) * c.C, 52),   // wte
                                   random_vector<float>(size_t(c.N) * c.C, 53),   // dout
                                   random_vector<float>(size_t(c.V) * c.C, 54)};  // dwte
        const Results r = run_both(gpu, arrays, tokens, [&](auto& o, auto& a, int32_t* tok) {
            o.embedding_forward(a[0], tok, a[1], c.N, c.C);
            o.embedding_backward(a[3], a[2], tok, c.N, c.C, c.V);
        });
        check_close("out", r.gpu[0], r.ref[0], kExact);
        // Each dwte row sums its token's rows of dout (up to ~330 of them): fp32 sums, below
        // 1e-6 of the largest row sum.
        check_close("dwte", r.gpu[3], r.ref[3], kElementwise);
    }
}

TEST_CASE("CUDA crossentropy matches the CPU for V from 3 to 50257, dlogits in place too",
          "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    struct Shape {
        int N, V;
    };
    for (const Shape s : {Shape{100, 3}, Shape{64, 1000}, Shape{8, 50257}}) {
        CAPTURE(s.N, s.V);
        std::vector<int32_t> targets = random_tokens(size_t(s.N), s.V, s.V, 60);
        targets.back() = 0;
        const size_t nv = size_t(s.N) * s.V;
        const float dloss = 1.0f / float(s.N);  // as Model::backward passes it
        // Logits in [-8, 8) give softmax rows far from uniform. losses and dlogits start as junk;
        // the last array is a second copy of the logits, turned into dlogits in place.
        const std::vector<float> logits = random_vector<float>(nv, 61, -8.0, 8.0);
        const HostArrays arrays = {random_vector<float>(size_t(s.N), 62), logits,
                                   random_vector<float>(nv, 63), logits};
        const Results r = run_both(gpu, arrays, targets, [&](auto& o, auto& a, int32_t* tok) {
            o.crossentropy_forward(a[0], a[1], tok, s.N, s.V);
            o.crossentropy_backward(a[2], a[1], tok, dloss, s.N, s.V);
            o.crossentropy_backward(a[3], a[3], tok, dloss, s.N, s.V);
        });
        check_close("losses", r.gpu[0], r.ref[0], kElementwise);
        for (const size_t i : {size_t(2), size_t(3)}) {
            INFO((i == 2 ? "separate dlogits" : "dlogits in place of logits"));
            check_close("dlogits", r.gpu[i], r.ref[i], kElementwise);
            check_close("dlogits off the targets", without_targets(r.gpu[i], targets, s.V),
                        without_targets(r.ref[i], targets, s.V), kElementwise);
        }
    }
}

TEST_CASE("CUDA sum and sum_squares accumulate in double for any length", "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    CpuOps<double> ref;
    // Lengths off every power of two a block or a grid could be made of, empty and one element.
    const size_t sizes[] = {0, 1, 2, 255, 257, 65537, 1000003, 5000003};
    for (const size_t n : sizes) {
        CAPTURE(n);
        const std::vector<float> x = random_vector<float>(n, 70 + n);
        const std::vector<double> xd = as_double(x);
        BackendArrays<float> backend(gpu, {x}, {});
        const float* dev = backend.ptrs()[0];
        double abs_sum = 0.0;
        for (const double v : xd) {
            abs_sum += std::abs(v);
        }
        // The terms are exact in double, so a double accumulation in any order is within a few
        // 1e-16 of sum|x|; an fp32 one would be off by ~1e-7 of it.
        const double got_sum = gpu.sum(dev, n);
        CHECK(std::abs(got_sum - ref.sum(xd.data(), n)) <= 1e-12 * abs_sum);
        // The squares are positive, so relative to the result: 1e-7 allows each square to be
        // rounded to fp32 before the double accumulation (2^-24 = 6e-8 each, same sign).
        const double want_squares = ref.sum_squares(xd.data(), n);
        const double got_squares = gpu.sum_squares(dev, n);
        CHECK(std::abs(got_squares - want_squares) <= 1e-7 * want_squares);
        // Fixed partials added in a fixed order: the same value on every call.
        CHECK(same_bits(std::vector<double>{gpu.sum(dev, n), gpu.sum_squares(dev, n)},
                        std::vector<double>{got_sum, got_squares}));
    }
}

TEST_CASE("CUDA scale matches the CPU", "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    for (const size_t n : {size_t(1), size_t(7), size_t(1000003)}) {
        CAPTURE(n);
        const Results r = run_both(gpu, {random_vector<float>(n, 80)}, {},
                                   [&](auto& o, auto& a, int32_t*) { o.scale(a[0], -0.37f, n); });
        check_close("x", r.gpu[0], r.ref[0], kOneRounding);
    }
}

TEST_CASE("CUDA adamw_update matches the CPU over several steps with clipping and decay",
          "[gpu][ops]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    const size_t n = 1000003;
    const int steps = 5;
    // params, then m and v starting at zero as in a fresh optimizer, then one gradient per step.
    HostArrays arrays = {random_vector<float>(n, 90), std::vector<float>(n, 0.0f),
                         std::vector<float>(n, 0.0f)};
    for (int t = 0; t < steps; t++) {
        arrays.push_back(random_vector<float>(n, 91 + t, -3.0, 3.0));
    }
    const Results r = run_both(gpu, arrays, {}, [&](auto& o, auto& a, int32_t*) {
        for (int t = 1; t <= steps; t++) {
            AdamWScalars s;
            s.lr = 1e-2f;
            s.beta1 = 0.9f;
            s.beta2 = 0.95f;
            s.eps = 1e-8f;
            s.weight_decay = 0.1f;
            s.bias_correction1 = 1.0f - std::pow(s.beta1, float(t));
            s.bias_correction2 = 1.0f - std::pow(s.beta2, float(t));
            s.grad_scale = 0.5f;  // as global-norm clipping would scale
            o.adamw_update(a[0], a[1], a[2], a[2 + t], n, s);
        }
    });
    check_close("params", r.gpu[0], r.ref[0], kElementwise);
    check_close("m", r.gpu[1], r.ref[1], kElementwise);
    check_close("v", r.gpu[2], r.ref[2], kElementwise);
}

TEST_CASE("CUDA from_host, to_host, copy and fill_zero move exact bits at odd offsets",
          "[gpu][memory]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    for (const size_t n : {size_t(1), size_t(3), size_t(1000003)}) {
        CAPTURE(n);
        const std::vector<float> x = random_vector<float>(n, 100);
        BackendArrays<float> backend(gpu, {x}, {});
        CHECK(same_bits(backend.read(0), as_double(x)));
    }

    // from_host and to_host at offsets, into a region whose neighbours must stay zero.
    const std::vector<float> src = random_vector<float>(10, 101);
    float* p = gpu.alloc(20);
    gpu.from_host(p + 3, src.data(), src.size());
    std::vector<float> back(20, -1.0f);
    gpu.to_host(back.data() + 1, p + 2, 12);
    std::vector<float> expected(20, -1.0f);
    expected[1] = 0.0f;
    std::copy(src.begin(), src.end(), expected.begin() + 2);
    expected[12] = 0.0f;
    gpu.release(p);
    CHECK(same_bits(back, expected));

    // copy and fill_zero on ranges that start and end off any alignment; the ends must survive.
    const size_t n = 1000003;
    const Results r = run_both(gpu, {random_vector<float>(n, 102), random_vector<float>(n, 103)},
                               {}, [&](auto& o, auto& a, int32_t*) {
                                   o.copy(a[1] + 3, a[0] + 1, n - 7);
                                   o.fill_zero(a[0] + 2, n - 5);
                               });
    check_close("filled", r.gpu[0], r.ref[0], kExact);
    check_close("copied", r.gpu[1], r.ref[1], kExact);
}

TEST_CASE("CUDA alloc returns zero-filled memory, also where freed memory is reused",
          "[gpu][memory]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    for (const size_t n : {size_t(1), size_t(1000), size_t(1 << 20) + 3}) {
        CAPTURE(n);
        // Dirty a block and free it first: the next alloc of the same size likely gets it back,
        // and a fresh cudaMalloc being zero by chance proves nothing.
        const std::vector<float> dirt(n, 1.5f);
        float* dirty = gpu.alloc(n);
        gpu.from_host(dirty, dirt.data(), n);
        gpu.release(dirty);
        float* p = gpu.alloc(n);
        std::vector<float> back(n, -1.0f);
        gpu.to_host(back.data(), p, n);
        gpu.release(p);
        CHECK(same_bits(back, std::vector<float>(n, 0.0f)));
    }
}

TEST_CASE("CUDA tokens_from_host delivers exact token ids, alloc_tokens is zero-filled",
          "[gpu][memory]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    // There is no way to read tokens back, so they are read through an exact gather: row v of
    // wte holds 2v and 2v + 1 (exact in fp32), so each output row names its token.
    const int V = 50257, C = 2, N = 1001, offset = 3;
    std::vector<float> wte(size_t(V) * C);
    for (size_t i = 0; i < wte.size(); i++) {
        wte[i] = float(i);
    }
    const std::vector<int32_t> tokens = random_tokens(N, V, V, 110);
    // Dirty and free a token block first, as for alloc above.
    const std::vector<int32_t> dirt(N + offset, 7);
    int32_t* dirty = gpu.alloc_tokens(N + offset);
    gpu.tokens_from_host(dirty, dirt.data(), dirt.size());
    gpu.release(dirty);

    int32_t* dev_tokens = gpu.alloc_tokens(N + offset);
    gpu.tokens_from_host(dev_tokens + offset, tokens.data(), N);
    BackendArrays<float> backend(gpu, {wte, std::vector<float>(size_t(N + offset) * C)}, {});
    gpu.embedding_forward(backend.ptrs()[1], dev_tokens, backend.ptrs()[0], N + offset, C);
    const std::vector<double> out = backend.read(1);
    gpu.release(dev_tokens);
    std::vector<double> expected;
    for (int i = 0; i < N + offset; i++) {
        const int32_t token = i < offset ? 0 : tokens[size_t(i - offset)];  // zero-filled head
        expected.push_back(2.0 * token);
        expected.push_back(2.0 * token + 1.0);
    }
    CHECK(same_bits(out, expected));
}

TEST_CASE("CUDA crossentropy_forward names a target outside the vocabulary", "[gpu][errors]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    const int N = 16, V = 1000;
    const HostArrays arrays = {std::vector<float>(N), random_vector<float>(size_t(N) * V, 120)};
    auto forward = [&](const std::vector<int32_t>& targets) {
        run_op(gpu, arrays, targets, [&](auto& o, auto& a, int32_t* tok) {
            o.crossentropy_forward(a[0], a[1], tok, N, V);
        });
    };
    // Values that appear nowhere else in the message (V itself is in "[0, 1000)").
    for (const int32_t bad : {777777, -4242}) {
        CAPTURE(bad);
        std::vector<int32_t> targets = random_tokens(N, V, V, 121);
        targets[9] = bad;
        const std::string message = error_message([&] { forward(targets); });
        INFO("message: " << message);
        CHECK(message.find(std::to_string(bad)) != std::string::npos);
        // The error is not sticky: a good call afterwards succeeds.
        targets[9] = 5;
        CHECK(error_message([&] { forward(targets); }).empty());
    }
}

TEST_CASE("CUDA embedding_backward rejects a token outside the vocabulary", "[gpu][errors]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    const int N = 16, C = 8, V = 100;
    const HostArrays arrays = {random_vector<float>(size_t(V) * C, 130),
                               random_vector<float>(size_t(N) * C, 131)};
    for (const int32_t bad : {V, -1}) {
        CAPTURE(bad);
        std::vector<int32_t> tokens = random_tokens(N, V, V, 132);
        tokens[11] = bad;
        CHECK_FALSE(error_message([&] {
                        run_op(gpu, arrays, tokens, [&](auto& o, auto& a, int32_t* tok) {
                            o.embedding_backward(a[0], a[1], tok, N, C, V);
                        });
                    }).empty());
    }
}

TEST_CASE("CUDA attention rejects head sizes over 128", "[gpu][errors]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    const int B = 1, T = 8;
    struct Heads {
        int C, NH;
    };
    for (const Heads h : {Heads{2 * 136, 2}, Heads{256, 1}}) {
        CAPTURE(h.C, h.NH);
        const size_t n = size_t(B) * T * h.C;
        const HostArrays arrays = {random_vector<float>(3 * n, 140), std::vector<float>(n),
                                   std::vector<float>(size_t(B) * h.NH * T), std::vector<float>(n),
                                   std::vector<float>(3 * n)};
        CHECK_FALSE(error_message([&] {
                        run_op(gpu, arrays, {}, [&](auto& o, auto& a, int32_t*) {
                            o.attention_forward(a[1], a[2], a[0], B, T, h.C, h.NH);
                        });
                    }).empty());
        CHECK_FALSE(error_message([&] {
                        run_op(gpu, arrays, {}, [&](auto& o, auto& a, int32_t*) {
                            o.attention_backward(a[4], a[3], a[0], a[1], a[2], B, T, h.C, h.NH);
                        });
                    }).empty());
    }
}

TEST_CASE("CudaOps on a device that does not exist throws naming the device", "[gpu][errors]") {
    STARLING_SKIP_WITHOUT_CUDA();
    const std::string message = error_message([] { CudaOps gpu(999); });
    INFO("message: " << message);
    CHECK(message.find("999") != std::string::npos);
}

TEST_CASE("CUDA bytes_in_use and peak_bytes follow alloc and release", "[gpu][memory]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    const size_t before = gpu.bytes_in_use();
    const size_t n = 1000003;
    float* x = gpu.alloc(n);
    CHECK(gpu.bytes_in_use() >= before + n * sizeof(float));
    CHECK(gpu.peak_bytes() >= gpu.bytes_in_use());
    int32_t* tokens = gpu.alloc_tokens(n);
    CHECK(gpu.bytes_in_use() >= before + n * (sizeof(float) + sizeof(int32_t)));
    const size_t peak = gpu.peak_bytes();
    CHECK(peak >= gpu.bytes_in_use());
    gpu.release(tokens);
    gpu.release(x);
    CHECK(gpu.bytes_in_use() == before);
    CHECK(gpu.peak_bytes() == peak);  // a high-water mark: release does not lower it
}

namespace {

// 2 layers of 4 heads of 16, d_ff 176 (no multiple of 64), vocab 256, context 64.
ModelConfig training_config(bool tied) {
    ModelConfig c;
    c.n_layer = 2;
    c.n_head = 4;
    c.d_model = 64;
    c.d_ff = 176;
    c.vocab_size = 256;
    c.context = 64;
    c.tied_embeddings = tied;
    return c;
}

constexpr int kTrainB = 4, kTrainT = 64, kTrainSteps = 20;

// Token t of sequence b at a step: strides of 5 with a small wobble, shifted per sequence and step,
// so there is something to learn and every run sees the same data.
int32_t training_token(int step, int b, int t) {
    return int32_t((31 * step + 57 * b + 5 * t + (t * t) % 7) % 256);
}

struct TrainingRun {
    std::vector<double> losses;  // per step, before its update
    std::vector<float> params;   // after the last update
};

TrainingRun train(Ops<float>& ops, bool tied) {
    Model<float> model(training_config(tied), ops, kTrainB, kTrainT);
    model.init_weights(1234);
    AdamW<float> adamw(ops, model.manifest(), AdamWConfig{});
    TrainingRun run;
    std::vector<int32_t> inputs(kTrainB * kTrainT), targets(kTrainB * kTrainT);
    for (int step = 0; step < kTrainSteps; step++) {
        for (int b = 0; b < kTrainB; b++) {
            for (int t = 0; t < kTrainT; t++) {
                inputs[size_t(b) * kTrainT + t] = training_token(step, b, t);
                targets[size_t(b) * kTrainT + t] = training_token(step, b, t + 1);
            }
        }
        run.losses.push_back(model.forward(inputs.data(), targets.data()));
        model.zero_grad();
        model.backward();
        adamw.step(model.params(), model.grads(), 1e-3f);
    }
    run.params.resize(model.num_params());
    ops.to_host(run.params.data(), model.params(), run.params.size());
    return run;
}

}  // namespace

TEST_CASE("20 training steps on CudaOps follow CpuOps<float>, tied and untied", "[gpu][model]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0);
    CpuOps<float> cpu;
    for (const bool tied : {true, false}) {
        CAPTURE(tied);
        const TrainingRun want = train(cpu, tied);
        const TrainingRun got = train(gpu, tied);
        // The run trains: on the CPU the loss falls from 5.57 to about 5.10.
        CHECK(want.losses.back() < want.losses.front() - 0.1);
        // The two backends round differently (cuBLAS and OpenBLAS sum in other orders, the GPU's
        // exp is not glibc's), and the differences compound over the steps. As a measure of that
        // drift, fp32 against fp64 on the CPU differs by at most 6e-9 relative in the loss and
        // 4e-6 (normalized) in the final weights over these 20 steps; the bounds below leave
        // more than 10x room for two fp32 orderings.
        for (int step = 0; step < kTrainSteps; step++) {
            CAPTURE(step, want.losses[step], got.losses[step]);
            CHECK(std::abs(got.losses[step] - want.losses[step]) <=
                  1e-4 * std::abs(want.losses[step]) + 1e-5);
        }
        check_close("final parameters", as_double(got.params), as_double(want.params), 1e-4);
    }
}

TEST_CASE("20 training steps with bf16 matmuls stay within bf16 rounding of the CPU",
          "[gpu][model]") {
    STARLING_SKIP_WITHOUT_CUDA();
    CudaOps gpu(0, MatmulMath::Bf16);
    CpuOps<float> cpu;
    const TrainingRun want = train(cpu, true);
    const TrainingRun got = train(gpu, true);
    // Every matmul operand carries ~2^-9 relative rounding noise, which moves the mean loss of a
    // 256-token batch by far less than 1%; 1e-2 relative bounds it per step, and the loss must
    // fall as on the CPU. (Weights are not compared: AdamW's normalised step turns tiny gradient
    // differences of near-zero elements into full-size steps in either direction.)
    for (int step = 0; step < kTrainSteps; step++) {
        CAPTURE(step, want.losses[step], got.losses[step]);
        CHECK(std::abs(got.losses[step] - want.losses[step]) <= 1e-2 * std::abs(want.losses[step]));
    }
    CHECK(got.losses.back() < got.losses.front() - 0.1);
}

TEST_CASE("two training runs on CudaOps give bit-identical losses and weights", "[gpu][model]") {
    STARLING_SKIP_WITHOUT_CUDA();
    // Determinism: every reduction has a fixed order, no kernel uses float atomics, and bf16's
    // stochastic rounding is a function of the data.
    for (const MatmulMath math : {MatmulMath::Fp32, MatmulMath::Bf16}) {
        CAPTURE(int(math));
        CudaOps gpu(0, math);
        const TrainingRun first = train(gpu, true);
        const TrainingRun second = train(gpu, true);
        CHECK(same_bits(first.losses, second.losses));
        CHECK(same_bits(first.params, second.params));
    }
}
