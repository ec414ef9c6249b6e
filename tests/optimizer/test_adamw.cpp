#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "model/manifest.h"
#include "optimizer/adamw.h"

using namespace starling;

namespace {

// A model with one layer of width 2: the arena mixes decayed matrices and undecayed norm gains.
ModelConfig tiny_config() {
    ModelConfig c;
    c.n_layer = 1;
    c.n_head = 1;
    c.d_model = 2;
    c.d_ff = 2;
    c.vocab_size = 3;
    c.context = 4;
    return c;
}

}  // namespace

TEST_CASE("AdamW matches two steps computed by hand, decay only on matrices") {
    CpuOps<double> ops;
    const ModelConfig config = tiny_config();
    const ParameterManifest manifest(config);
    AdamWConfig hp;
    hp.beta1 = 0.9f;
    hp.beta2 = 0.99f;
    hp.eps = 1e-8f;
    hp.weight_decay = 0.5f;
    hp.grad_clip = 0.0f;
    AdamW<double> adamw(ops, manifest, hp);

    const size_t n = manifest.total();
    std::vector<double> params(n, 1.0), grads(n, 0.0);
    const size_t wte = manifest.find("model.embed_tokens.weight").offset;
    const size_t gain = manifest.find("model.norm.weight").offset;
    grads[wte] = 0.5;
    grads[gain] = 0.5;
    const double lr = 0.1;

    // Step 1: m = 0.1 * 0.5 = 0.05, v = 0.01 * 0.25 = 0.0025; m_hat = 0.5, v_hat = 0.25;
    // update = m_hat / (sqrt(v_hat) + eps) = 1 (minus a 2e-8 eps effect).
    // Matrix: p = 1 - 0.1 * (1 + 0.5 * 1) = 0.85. Gain: p = 1 - 0.1 * 1 = 0.9.
    adamw.step(params.data(), grads.data(), float(lr));
    CHECK(params[wte] == Approx(0.85).epsilon(1e-6));
    CHECK(params[gain] == Approx(0.9).epsilon(1e-6));
    // A zero gradient still decays a matrix: m = v = 0, p = 1 - 0.1 * 0.5 * 1 = 0.95 (up to the
    // float rounding of the hyperparameters).
    CHECK(params[wte + 1] == Approx(0.95).epsilon(1e-7));
    CHECK(params[gain + 1] == 1.0);

    // Step 2 with gradient -0.25: m = 0.9*0.05 - 0.025 = 0.02, v = 0.99*0.0025 + 0.01*0.0625
    // = 0.003100; m_hat = 0.02/0.19, v_hat = 0.0031/0.0199.
    grads[wte] = -0.25;
    grads[gain] = -0.25;
    adamw.step(params.data(), grads.data(), float(lr));
    const double m_hat = 0.02 / 0.19, v_hat = 0.0031 / (1 - 0.99 * 0.99);
    const double u = m_hat / (std::sqrt(v_hat) + 1e-8);
    CHECK(params[wte] == Approx(0.85 - 0.1 * (u + 0.5 * 0.85)).epsilon(1e-6));
    CHECK(params[gain] == Approx(0.9 - 0.1 * u).epsilon(1e-6));
    CHECK(adamw.steps_taken() == 2);
    CHECK(adamw.m()[wte] == Approx(0.02));
    CHECK(adamw.v()[wte] == Approx(0.0031));
}

TEST_CASE("global-norm clipping scales the gradient before the moments") {
    CpuOps<double> ops;
    const ParameterManifest manifest(tiny_config());
    AdamWConfig hp;
    hp.weight_decay = 0.0f;
    hp.grad_clip = 1.0f;
    AdamW<double> adamw(ops, manifest, hp);
    const size_t n = manifest.total();
    std::vector<double> params(n, 0.0), grads(n, 0.0);
    grads[0] = 3.0;
    grads[1] = 4.0;  // norm 5, so the clipped gradient is (0.6, 0.8)
    const AdamWStepStats stats = adamw.step(params.data(), grads.data(), 0.1f);
    CHECK(stats.grad_norm == Approx(5.0));
    CHECK_FALSE(stats.skipped);
    CHECK(adamw.m()[0] == Approx((1 - hp.beta1) * 0.6));
    CHECK(adamw.m()[1] == Approx((1 - hp.beta1) * 0.8));
    CHECK(adamw.v()[1] == Approx((1 - hp.beta2) * 0.64));
}

TEST_CASE("a non-finite gradient skips the update and leaves all state alone") {
    CpuOps<double> ops;
    const ParameterManifest manifest(tiny_config());
    AdamW<double> adamw(ops, manifest, AdamWConfig{});
    const size_t n = manifest.total();
    std::vector<double> params(n, 1.0), grads(n, 0.1);
    grads[3] = std::numeric_limits<double>::quiet_NaN();
    const AdamWStepStats stats = adamw.step(params.data(), grads.data(), 0.1f);
    CHECK(stats.skipped);
    CHECK(adamw.steps_taken() == 0);
    for (size_t i = 0; i < n; i++) {
        REQUIRE(params[i] == 1.0);
        REQUIRE(adamw.m()[i] == 0.0);
    }
}

TEST_CASE("invalid AdamW settings are rejected with the field named") {
    AdamWConfig hp;
    hp.beta2 = 1.0f;
    CHECK_THROWS_WITH(hp.validate(), Catch::Contains("beta2"));
    hp = AdamWConfig{};
    hp.eps = 0.0f;
    CHECK_THROWS_WITH(hp.validate(), Catch::Contains("eps"));
}
