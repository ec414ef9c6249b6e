#include <catch2/catch.hpp>

#include "common/error.h"
#include "model/manifest.h"
#include "tests/support/model_configs.h"

using namespace starling;

namespace {

ModelConfig config_with(int layers, bool tied) { return test::tiny_model_config(layers, tied); }

}  // namespace

TEST_CASE("manifest lays tensors out back to back with Hugging Face names") {
    const ParameterManifest m(config_with(2, false));
    const auto& t = m.tensors();
    REQUIRE(t.size() == 1 + 2 * 9 + 2);
    size_t expected_offset = 0;
    for (const TensorInfo& info : t) {
        CHECK(info.offset == expected_offset);
        expected_offset += info.numel;
    }
    CHECK(m.total() == expected_offset);
    // By hand: embed 11*8, per layer 2 gains of 8 + 4 attention 8x8 + 3 MLP 12x8,
    // final gain 8, untied head 11*8.
    CHECK(m.total() == 88 + 2 * (16 + 256 + 288) + 8 + 88);
    CHECK(t.front().name == "model.embed_tokens.weight");
    CHECK(t.back().name == "lm_head.weight");
    CHECK(m.find("model.layers.1.mlp.down_proj.weight").shape == std::vector<int64_t>{8, 12});
    CHECK(m.find("model.layers.0.mlp.gate_proj.weight").shape == std::vector<int64_t>{12, 8});
}

TEST_CASE("q, k, v and gate, up are adjacent so each group is one matrix") {
    const ParameterManifest m(config_with(1, true));
    const size_t q = m.find("model.layers.0.self_attn.q_proj.weight").offset;
    CHECK(m.find("model.layers.0.self_attn.k_proj.weight").offset == q + 64);
    CHECK(m.find("model.layers.0.self_attn.v_proj.weight").offset == q + 128);
    const size_t gate = m.find("model.layers.0.mlp.gate_proj.weight").offset;
    CHECK(m.find("model.layers.0.mlp.up_proj.weight").offset == gate + 96);
}

TEST_CASE("tied embeddings have no separate head") {
    const ParameterManifest m(config_with(1, true));
    CHECK_THROWS_AS(m.find("lm_head.weight"), Error);
    CHECK(m.tensors().back().name == "model.norm.weight");
}

TEST_CASE("decay segments cover the arena and exclude norm gains") {
    const ParameterManifest m(config_with(2, true));
    size_t covered = 0, decayed = 0;
    for (const DecaySegment& s : m.decay_segments()) {
        CHECK(s.offset == covered);
        covered += s.numel;
        if (s.decay) decayed += s.numel;
    }
    CHECK(covered == m.total());
    CHECK(decayed == m.total() - (2 * 2 + 1) * 8);
}

TEST_CASE("the fingerprint changes with anything that changes the computation") {
    const std::string base = ParameterManifest(config_with(2, true)).fingerprint();
    CHECK(base.size() == 16);
    CHECK(ParameterManifest(config_with(2, true)).fingerprint() == base);
    CHECK(ParameterManifest(config_with(3, true)).fingerprint() != base);
    CHECK(ParameterManifest(config_with(2, false)).fingerprint() != base);
    ModelConfig theta = config_with(2, true);
    theta.rope_theta = 500000.0f;
    CHECK(ParameterManifest(theta).fingerprint() != base);
    ModelConfig heads = config_with(2, true);
    heads.n_head = 4;
    CHECK(ParameterManifest(heads).fingerprint() != base);
}

TEST_CASE("invalid model configs name the field") {
    ModelConfig c = config_with(1, true);
    c.n_head = 3;
    CHECK_THROWS_WITH(ParameterManifest(c), Catch::Contains("not divisible by n_head"));
    c = config_with(1, true);
    c.vocab_size = 70000;
    CHECK_THROWS_WITH(ParameterManifest(c), Catch::Contains("vocab_size"));
}

TEST_CASE(
    "a model signature names every key that tells two models apart, and the differences read back") {
    ModelConfig a;
    const std::string signature = model_signature(a);
    CHECK(
        signature ==
        "n_layer=2 n_head=4 d_model=64 d_ff=192 vocab_size=256 context=64 tied_embeddings=true rope_theta=10000 "
        "norm_eps=9.99999975e-06");
    CHECK(signature_differences(signature, signature).empty());
    ModelConfig b = a;
    b.n_layer = 4;
    b.tied_embeddings = false;
    CHECK(signature_differences(model_signature(b), signature) ==
          "n_layer 4 there, 2 here; tied_embeddings false there, true here");
    // A peer of another version that sends a key this one does not know, or none at all.
    CHECK(signature_differences("n_layer=2 qk_norm=true", "n_layer=2") ==
          "qk_norm true there, none here");
    CHECK(signature_differences("", "n_layer=2") == "n_layer none there, 2 here");
}
