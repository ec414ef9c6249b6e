// Text from a model: the next token drawn from the model's distribution again and again, the way
// a language model is sampled. Each step runs a whole forward pass over the last seq_len()
// tokens (no key/value cache): simple, and plenty for looking at what a checkpoint has learned.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "model/model.h"

namespace starling {

struct SampleOptions {
    int tokens = 200;          // how many to add
    float temperature = 0.8f;  // 0: always the most likely token
    int top_k = 0;             // draw among the k most likely only; 0: all
    int vocab =
        0;  // draw among ids below this only (a tokenizer's inside a padded embedding); 0: all
    uint64_t seed = 1;
};

// The tokens that follow `prompt` (at least one token), options.tokens of them. The model must
// take one sequence (batch_size 1); once the text is longer than seq_len() the window slides, the
// oldest tokens falling out. Throws starling::Error for an empty prompt or bad options.
std::vector<int32_t> continue_tokens(Model<float>& model, std::span<const int32_t> prompt,
                                     const SampleOptions& options);

// The index of token drawn from softmax(logits / temperature) restricted to the top_k largest,
// with u uniform in [0, 1); temperature 0 gives the first largest logit.
int draw_token(std::span<const float> logits, float temperature, int top_k, double u);

}  // namespace starling
