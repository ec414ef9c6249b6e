#include <catch2/catch.hpp>

#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "tests/support/fd_check.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::test;

namespace {

// Hugging Face Llama: q_embed = q * cos + rotate_half(q) * sin, with rotate_half(x) =
// [-x2, x1] and cos/sin of position * theta^(-2i/hs) repeated over both halves of the head.
template <typename T>
std::vector<double> rope_reference(const std::vector<T>& qkv, QkvShape s, double theta) {
    int hs = s.C / s.NH, half = hs / 2;
    std::vector<double> ref(qkv.begin(), qkv.end());
    for (int b = 0; b < s.B; b++) {
        for (int t = 0; t < s.T; t++) {
            size_t row = (size_t(b) * s.T + t) * 3 * s.C;
            for (int head = 0; head < 2 * s.NH; head++) {  // q heads, then k heads
                size_t base = row + size_t(head) * hs;
                for (int d = 0; d < hs; d++) {
                    int i = d % half;
                    double angle = t / std::pow(theta, 2.0 * i / hs);
                    double rotated_half =
                        d < half ? -double(qkv[base + d + half]) : double(qkv[base + d - half]);
                    ref[base + d] =
                        double(qkv[base + d]) * std::cos(angle) + rotated_half * std::sin(angle);
                }
            }
        }
    }
    return ref;
}

}  // namespace

TEMPLATE_TEST_CASE("rope_forward matches the Hugging Face formula", "[rope]", float, double) {
    using T = TestType;
    CpuOps<T> ops;
    const float theta = 10000.0f;
    for (QkvShape s : {QkvShape{2, 5, 16, 2}, QkvShape{1, 9, 24, 3}}) {
        INFO("B " << s.B << " T " << s.T << " C " << s.C << " NH " << s.NH);
        auto qkv = random_vector<T>(size_t(s.B) * s.T * 3 * s.C, 31);
        auto ref = rope_reference(qkv, s, theta);
        auto out = qkv;
        ops.rope_forward(out.data(), s.B, s.T, s.C, s.NH, theta);
        REQUIRE(max_rel_diff(out, ref) < forward_tol<T>());
        // v passes through bit for bit.
        for (size_t row = 0; row < size_t(s.B) * s.T; row++) {
            for (int c = 2 * s.C; c < 3 * s.C; c++) {
                REQUIRE(out[row * 3 * s.C + c] == qkv[row * 3 * s.C + c]);
            }
        }
    }
}

TEST_CASE("rope_backward matches finite differences", "[rope][grad]") {
    CpuOps<double> ops;
    const float theta = 100.0f;  // small theta: large angles on every pair
    for (QkvShape s : {QkvShape{2, 5, 8, 2}, QkvShape{2, 1, 8, 2}}) {
        INFO("B " << s.B << " T " << s.T);
        size_t n = size_t(s.B) * s.T * 3 * s.C;
        auto qkv = random_vector<double>(n, 32);
        auto R = random_vector<double>(n, 33);
        auto loss = [&] {
            auto rotated = qkv;
            ops.rope_forward(rotated.data(), s.B, s.T, s.C, s.NH, theta);
            return weighted_sum(rotated, R);
        };
        auto dqkv = R;
        ops.rope_backward(dqkv.data(), s.B, s.T, s.C, s.NH, theta);
        REQUIRE(fd_max_rel_error(loss, qkv.data(), dqkv.data(), n) < kGradTol);
    }
}
