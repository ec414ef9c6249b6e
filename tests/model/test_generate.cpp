// Sampling (model/generate.h): the draw against hand-computed probabilities, and the sliding
// window against a model that sees only what fits.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "model/generate.h"
#include "model/model.h"
#include "tests/support/model_configs.h"

using namespace starling;
using Catch::Contains;

TEST_CASE("a draw follows softmax(logits / temperature) over the top k, by hand") {
    // Probabilities 1/4, 1/2, 1/4; in order of likelihood: token 1 (up to 0.5), 0 (0.75), 2 (1.0).
    const std::vector<float> logits{0.0f, std::log(2.0f), 0.0f};
    CHECK(draw_token(logits, 1.0f, 0, 0.49) == 1);
    CHECK(draw_token(logits, 1.0f, 0, 0.51) == 0);
    CHECK(draw_token(logits, 1.0f, 0, 0.74) == 0);
    CHECK(draw_token(logits, 1.0f, 0, 0.76) == 2);
    CHECK(draw_token(logits, 1.0f, 0, 0.999999) == 2);
    // Temperature 1/2 squares the weights: 1, 4, 1 over 6, so token 1 up to 2/3, token 0 to 5/6.
    CHECK(draw_token(logits, 0.5f, 0, 0.66) == 1);
    CHECK(draw_token(logits, 0.5f, 0, 0.70) == 0);
    CHECK(draw_token(logits, 0.5f, 0, 0.84) == 2);
    // Top 2: tokens 1 and 0 with weights 2 and 1, so 0 from 2/3 on, never 2.
    CHECK(draw_token(logits, 1.0f, 2, 0.60) == 1);
    CHECK(draw_token(logits, 1.0f, 2, 0.70) == 0);
    CHECK(draw_token(logits, 1.0f, 2, 0.99) == 0);
    CHECK(draw_token(logits, 1.0f, 1, 0.99) == 1);
    // Temperature 0: the most likely, the first of equals.
    CHECK(draw_token(logits, 0.0f, 0, 0.99) == 1);
    CHECK(draw_token(std::vector<float>{3.0f, 1.0f, 3.0f}, 0.0f, 0, 0.5) == 0);
}

TEST_CASE("a continuation past the context sees only the last context tokens") {
    ModelConfig config = test::tiny_model_config(1);
    config.init_std = 0.5f;  // far from uniform, so the greedy choices are clear
    const int T = config.context;
    CpuOps<float> ops;
    Model<float> model(config, ops, 1, config.context);
    model.init_weights(5);
    SampleOptions greedy;
    greedy.temperature = 0.0f;
    greedy.tokens = 12;
    const std::vector<int32_t> prompt{3, 1, 4, 1, 5};
    const std::vector<int32_t> out = continue_tokens(model, prompt, greedy);
    REQUIRE(out.size() == 12);

    // Each token again by hand: one forward over the window that ends before it.
    std::vector<int32_t> text = prompt;
    for (size_t i = 0; i < out.size(); i++) {
        const size_t length = std::min<size_t>(text.size(), T);
        std::vector<int32_t> window(T, 0), targets(T, 0);
        std::copy(text.end() - static_cast<std::ptrdiff_t>(length), text.end(), window.begin());
        model.forward(window.data(), targets.data());
        const std::vector<float> logits = model.logits_at(0, static_cast<int>(length) - 1);
        const int expected =
            static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        CHECK(out[i] == expected);
        text.push_back(out[i]);
    }

    // A seeded draw is the same every time.
    SampleOptions drawn;
    drawn.tokens = 12;
    drawn.seed = 9;
    CHECK(continue_tokens(model, prompt, drawn) == continue_tokens(model, prompt, drawn));

    CHECK_THROWS_WITH(continue_tokens(model, std::vector<int32_t>{}, greedy),
                      Contains("prompt is empty"));
    SampleOptions cold = greedy;
    cold.temperature = -1.0f;
    CHECK_THROWS_WITH(continue_tokens(model, prompt, cold), Contains("temperature"));
    CHECK_THROWS_WITH(model.logits_at(0, T), Contains("position " + std::to_string(T)));
}

TEST_CASE("draws stay below the tokenizer's vocabulary inside a padded embedding") {
    ModelConfig config = test::tiny_model_config(1);  // vocabulary 11
    CpuOps<float> ops;
    Model<float> model(config, ops, 1, config.context);
    model.init_weights(3);
    SampleOptions hot;
    hot.temperature = 100.0f;  // nearly uniform: all 11 ids come up among 300 draws
    hot.tokens = 300;
    const std::vector<int32_t> prompt{1, 2};
    const std::vector<int32_t> all = continue_tokens(model, prompt, hot);
    CHECK(*std::max_element(all.begin(), all.end()) >= 5);
    hot.vocab = 5;
    const std::vector<int32_t> within = continue_tokens(model, prompt, hot);
    CHECK(*std::max_element(within.begin(), within.end()) < 5);
    CHECK(*std::max_element(within.begin(), within.end()) == 4);
    hot.vocab = 12;
    CHECK_THROWS_WITH(continue_tokens(model, prompt, hot),
                      Contains("vocab 12 is outside [0, the model's 11]"));
}
