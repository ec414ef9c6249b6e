#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "model/model.h"
#include "tests/support/fd_check.h"
#include "tests/support/model_configs.h"

using namespace starling;

namespace {

ModelConfig small_config(bool tied) {
    ModelConfig c = test::tiny_model_config(2, tied);
    c.init_std = 0.3f;  // larger than usual so every path carries a gradient worth checking
    return c;
}

std::vector<int32_t> tokens(int n, int vocab, int salt) {
    std::vector<int32_t> t(n);
    for (int i = 0; i < n; i++) t[i] = (i * 7 + salt * 3 + i * i) % vocab;
    return t;
}

}  // namespace

TEST_CASE("whole-model gradient matches central differences in double precision") {
    const bool tied = GENERATE(true, false);
    CAPTURE(tied);
    CpuOps<double> ops;
    const ModelConfig config = small_config(tied);
    const int B = 2, T = 5;
    Model<double> model(config, ops, B, T);
    model.init_weights(7);
    // Norm gains away from 1 so their gradients are not special.
    for (const TensorInfo& t : model.manifest().tensors()) {
        if (t.shape.size() == 1) {
            for (size_t i = 0; i < t.numel; i++)
                model.params()[t.offset + i] = 1.0 + 0.1 * std::sin(i + 1.0);
        }
    }
    const std::vector<int32_t> in = tokens(B * T, config.vocab_size, 1);
    const std::vector<int32_t> tg = tokens(B * T, config.vocab_size, 2);

    model.forward(in.data(), tg.data());
    model.zero_grad();
    model.backward();
    const std::vector<double> analytic(model.grads(), model.grads() + model.num_params());

    // A sample of elements from every tensor: first, last and a few in between.
    for (const TensorInfo& t : model.manifest().tensors()) {
        std::vector<size_t> sample;
        for (size_t k = 0; k < 5; k++) sample.push_back(t.offset + k * (t.numel - 1) / 4);
        const double err =
            test::fd_max_rel_error<double>([&] { return model.forward(in.data(), tg.data()); },
                                           model.params(), analytic.data(), sample);
        CAPTURE(t.name);
        CHECK(err < 1e-6);
    }
}

TEST_CASE("float and double models agree on loss and gradient") {
    const ModelConfig config = small_config(true);
    const int B = 2, T = 6;
    CpuOps<double> ops_d;
    CpuOps<float> ops_f;
    Model<double> md(config, ops_d, B, T);
    Model<float> mf(config, ops_f, B, T);
    md.init_weights(3);
    mf.init_weights(3);
    const std::vector<int32_t> in = tokens(B * T, config.vocab_size, 4);
    const std::vector<int32_t> tg = tokens(B * T, config.vocab_size, 5);
    const double ld = md.forward(in.data(), tg.data());
    const double lf = mf.forward(in.data(), tg.data());
    CHECK(lf == Approx(ld).epsilon(1e-5));
    md.zero_grad();
    md.backward();
    mf.zero_grad();
    mf.backward();
    double max_diff = 0.0, max_ref = 0.0;
    for (size_t i = 0; i < md.num_params(); i++) {
        max_diff = std::max(max_diff, std::abs(double(mf.grads()[i]) - md.grads()[i]));
        max_ref = std::max(max_ref, std::abs(md.grads()[i]));
    }
    CHECK(max_diff / max_ref < 1e-4);
}

TEST_CASE("a fresh model predicts close to uniform") {
    // With small weights the logits are near zero, so the loss is near log(V). Targets differ
    // from inputs: with tied embeddings a token's own logit is lifted by |e|^2 / rms(e).
    CpuOps<float> ops;
    ModelConfig config = small_config(true);
    config.init_std = 0.02f;
    Model<float> model(config, ops, 2, 6);
    model.init_weights(1);
    std::vector<int32_t> in = tokens(12, config.vocab_size, 0), tg(12);
    for (int i = 0; i < 12; i++) tg[i] = (in[i] + 1 + i % 3) % config.vocab_size;
    CHECK(model.forward(in.data(), tg.data()) == Approx(std::log(11.0)).epsilon(0.02));
}

TEST_CASE("the causal mask holds: later tokens never change earlier losses") {
    CpuOps<double> ops;
    const ModelConfig config = small_config(false);
    Model<double> full(config, ops, 1, 6), prefix(config, ops, 1, 4);
    full.init_weights(5);
    prefix.init_weights(5);
    std::vector<int32_t> in = tokens(6, config.vocab_size, 1);
    const std::vector<int32_t> tg = tokens(6, config.vocab_size, 2);
    full.forward(in.data(), tg.data());
    const std::vector<double> before = full.position_losses();
    in[5] = (in[5] + 1) % config.vocab_size;
    in[4] = (in[4] + 3) % config.vocab_size;
    full.forward(in.data(), tg.data());
    const std::vector<double> after = full.position_losses();
    prefix.forward(in.data(), tg.data());
    const std::vector<double> short_run = prefix.position_losses();
    for (int t = 0; t < 4; t++) {
        CHECK(after[t] == before[t]);
        CHECK(short_run[t] == Approx(after[t]).epsilon(1e-12));
    }
    CHECK(after[4] != before[4]);
    CHECK(after[5] != before[5]);
}

TEST_CASE("initialisation is a pure function of the seed") {
    CpuOps<float> ops;
    const ModelConfig config = small_config(true);
    Model<float> a(config, ops, 1, 4), b(config, ops, 2, 6), c(config, ops, 1, 4);
    a.init_weights(42);
    b.init_weights(42);
    c.init_weights(43);
    bool all_equal = true, any_differs = false;
    for (size_t i = 0; i < a.num_params(); i++) {
        all_equal = all_equal && a.params()[i] == b.params()[i];
        any_differs = any_differs || a.params()[i] != c.params()[i];
    }
    CHECK(all_equal);
    CHECK(any_differs);
    const TensorInfo& gain = a.manifest().find("model.layers.1.input_layernorm.weight");
    CHECK(a.params()[gain.offset] == 1.0f);
}

TEST_CASE("bad shapes and tokens are rejected with a clear error") {
    CpuOps<float> ops;
    const ModelConfig config = small_config(true);
    CHECK_THROWS_WITH(Model<float>(config, ops, 1, 7), Catch::Contains("context"));
    Model<float> model(config, ops, 1, 4);
    std::vector<int32_t> in = {1, 2, 11, 3};
    CHECK_THROWS_WITH(model.forward(in.data(), in.data()), Catch::Contains("vocabulary"));
}
