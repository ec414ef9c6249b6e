// Model shapes small enough for exhaustive checks.
#pragma once

#include "model/config.h"

namespace starling::test {

// 2 heads of size 4, SwiGLU width 12, vocabulary 11, context 6.
inline ModelConfig tiny_model_config(int n_layer = 2, bool tied = true) {
    ModelConfig c;
    c.n_layer = n_layer;
    c.n_head = 2;
    c.d_model = 8;
    c.d_ff = 12;
    c.vocab_size = 11;
    c.context = 6;
    c.tied_embeddings = tied;
    return c;
}

// Four layers of 4 heads at the caller's widths: shapes whose messages fill or span codec chunks
// (128, 384, 256: 885,888 parameters, one chunk in Q8 or F32).
inline ModelConfig four_layer_model_config(int d_model, int d_ff, int vocab) {
    ModelConfig c;
    c.n_layer = 4;
    c.n_head = 4;
    c.d_model = d_model;
    c.d_ff = d_ff;
    c.vocab_size = vocab;
    return c;
}

}  // namespace starling::test
