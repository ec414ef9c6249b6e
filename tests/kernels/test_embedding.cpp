#include <catch2/catch.hpp>

#include <cstring>

#include "kernels/cpu/cpu_ops.h"
#include "common/error.h"
#include "tests/support/fd_check.h"
#include "tests/support/determinism.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::test;

namespace {
// Repeats (3, 0) and unused rows (2, 4, 5, 6, 8) of an 11-token vocabulary.
const std::vector<int32_t> kTokens = {3, 0, 3, 7, 10, 3, 1, 0, 9, 3};
constexpr int kV = 11;
}  // namespace

TEMPLATE_TEST_CASE("embedding_forward copies the token rows", "[embedding]", float, double) {
    using T = TestType;
    CpuOps<T> ops;
    const int N = int(kTokens.size()), C = 8;
    auto wte = random_vector<T>(size_t(kV) * C, 61);
    std::vector<T> out(size_t(N) * C);
    ops.embedding_forward(out.data(), kTokens.data(), wte.data(), N, C);
    for (int n = 0; n < N; n++) {
        for (int c = 0; c < C; c++) {
            REQUIRE(out[n * C + c] == wte[kTokens[n] * C + c]);
        }
    }
}

TEST_CASE("embedding_backward matches finite differences and accumulates", "[embedding][grad]") {
    CpuOps<double> ops;
    const int N = int(kTokens.size());
    // C = 150 spans several channel slices, the last one partial.
    for (int C : {8, 150}) {
        INFO("C " << C);
        auto wte = random_vector<double>(size_t(kV) * C, 62);
        auto R = random_vector<double>(size_t(N) * C, 63);
        auto loss = [&] {
            std::vector<double> out(R.size());
            ops.embedding_forward(out.data(), kTokens.data(), wte.data(), N, C);
            return weighted_sum(out, R);
        };
        auto dwte0 = random_vector<double>(wte.size(), 64);
        auto dwte = dwte0;
        ops.embedding_backward(dwte.data(), R.data(), kTokens.data(), N, C, kV);
        auto grad = minus(dwte, dwte0);
        REQUIRE(fd_max_rel_error(loss, wte.data(), grad.data(), wte.size()) < kGradTol);
    }
}

TEST_CASE("embedding_backward is independent of the thread count", "[embedding][determinism]") {
    CpuOps<float> ops;
    const int N = 400, C = 200, V = 7;  // few tokens: many rows collide
    std::vector<int32_t> tokens(N);
    for (int n = 0; n < N; n++) {
        tokens[n] = (n * 5 + n / 3) % V;
    }
    auto dout = random_vector<float>(size_t(N) * C, 65);
    require_same_bits_for_any_thread_count([&] {
        std::vector<float> dwte(size_t(V) * C);
        ops.embedding_backward(dwte.data(), dout.data(), tokens.data(), N, C, V);
        return dwte;
    });
}

TEST_CASE("embedding_backward rejects a token outside the vocabulary", "[embedding]") {
    CpuOps<double> ops;
    const int C = 4;
    std::vector<int32_t> tokens = {1, kV};
    std::vector<double> dout(tokens.size() * C, 1.0), dwte(size_t(kV) * C);
    REQUIRE_THROWS_AS(ops.embedding_backward(dwte.data(), dout.data(), tokens.data(), 2, C, kV),
                      Error);
}
