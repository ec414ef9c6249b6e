#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/cpu_ops.h"
#include "tests/support/fd_check.h"
#include "tests/support/determinism.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::test;

namespace {

struct AttentionReference {
    std::vector<double> out;  // (B,T,C)
    std::vector<double> lse;  // (B,NH,T)
};

// Per head: the full (T,T) score matrix with -inf above the diagonal, a plain softmax of each row
// and P @ V.
template <typename T>
AttentionReference attention_reference(const std::vector<T>& qkv, QkvShape s) {
    int hs = s.C / s.NH;
    double scale = 1.0 / std::sqrt(double(hs));
    auto at = [&](int b, int t, int col) {
        return double(qkv[(size_t(b) * s.T + t) * 3 * s.C + col]);
    };
    AttentionReference ref{std::vector<double>(size_t(s.B) * s.T * s.C),
                           std::vector<double>(size_t(s.B) * s.NH * s.T)};
    std::vector<double> scores(size_t(s.T) * s.T);
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            for (int i = 0; i < s.T; i++) {
                for (int j = 0; j < s.T; j++) {
                    double dot = 0.0;
                    for (int d = 0; d < hs; d++) {
                        dot += at(b, i, h * hs + d) * at(b, j, s.C + h * hs + d);
                    }
                    scores[i * s.T + j] =
                        j <= i ? dot * scale : -std::numeric_limits<double>::infinity();
                }
            }
            for (int i = 0; i < s.T; i++) {
                double z = 0.0;
                for (int j = 0; j < s.T; j++) {
                    z += std::exp(scores[i * s.T + j]);
                }
                ref.lse[(size_t(b) * s.NH + h) * s.T + i] = std::log(z);
                for (int d = 0; d < hs; d++) {
                    double o = 0.0;
                    for (int j = 0; j < s.T; j++) {
                        o += std::exp(scores[i * s.T + j]) / z * at(b, j, 2 * s.C + h * hs + d);
                    }
                    ref.out[(size_t(b) * s.T + i) * s.C + h * hs + d] = o;
                }
            }
        }
    }
    return ref;
}

}  // namespace

TEMPLATE_TEST_CASE("attention_forward matches a naive causal softmax", "[attention]", float,
                   double) {
    using T = TestType;
    CpuOps<T> ops;
    for (QkvShape s : {QkvShape{2, 5, 8, 2}, QkvShape{2, 7, 12, 3}, QkvShape{3, 1, 8, 2}}) {
        INFO("B " << s.B << " T " << s.T << " C " << s.C << " NH " << s.NH);
        auto qkv = random_vector<T>(size_t(s.B) * s.T * 3 * s.C, 41, -2.0, 2.0);
        auto ref = attention_reference(qkv, s);
        std::vector<T> out(ref.out.size()), lse(ref.lse.size());
        ops.attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
        REQUIRE(max_rel_diff(out, ref.out) < forward_tol<T>());
        REQUIRE(max_rel_diff(lse, ref.lse) < forward_tol<T>());
    }
}

TEST_CASE("attention_backward matches finite differences", "[attention][grad]") {
    CpuOps<double> ops;
    for (QkvShape s : {QkvShape{2, 5, 8, 2}, QkvShape{2, 1, 8, 2}, QkvShape{1, 6, 12, 3}}) {
        INFO("B " << s.B << " T " << s.T << " C " << s.C << " NH " << s.NH);
        size_t n = size_t(s.B) * s.T * 3 * s.C;
        auto qkv = random_vector<double>(n, 42, -2.0, 2.0);
        auto R = random_vector<double>(size_t(s.B) * s.T * s.C, 43);
        std::vector<double> out(R.size()), lse(size_t(s.B) * s.NH * s.T);
        auto loss = [&] {
            ops.attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
            return weighted_sum(out, R);
        };
        loss();
        // Junk in dqkv checks that it is overwritten, not added to.
        auto dqkv = random_vector<double>(n, 44, 5.0, 6.0);
        ops.attention_backward(dqkv.data(), R.data(), qkv.data(), out.data(), lse.data(), s.B, s.T,
                               s.C, s.NH);
        REQUIRE(fd_max_rel_error(loss, qkv.data(), dqkv.data(), n) < kGradTol);
    }
}

TEST_CASE("attention_backward is bit-reproducible and independent of the thread count",
          "[attention][determinism]") {
    CpuOps<float> ops;
    const QkvShape s{2, 48, 64, 4};
    auto qkv = random_vector<float>(size_t(s.B) * s.T * 3 * s.C, 45);
    auto dout = random_vector<float>(size_t(s.B) * s.T * s.C, 46);
    std::vector<float> out(dout.size()), lse(size_t(s.B) * s.NH * s.T);
    ops.attention_forward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    require_same_bits_for_any_thread_count([&] {
        std::vector<float> dqkv(qkv.size());
        ops.attention_backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B,
                               s.T, s.C, s.NH);
        return dqkv;
    });
}
