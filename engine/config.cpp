#include "engine/config.h"

#include <fmt/format.h>
#include <memory>

#include "common/error.h"
#include "engine/config_keys.h"
#include "data/tokenizer.h"
#include "kernels/backend.h"

namespace starling {

void TrainConfig::validate() const {
    TrainConfig keys = *this;  // the visit takes the fields by reference
    KeyRangeChecker check;
    visit_train_config(check, keys);
    model.validate();
    auto need = [](bool ok, const std::string& problem) {
        if (!ok) throw Error("config: " + problem);
    };
    need(seq_len <= model.context,
         "[train].seq_len must be in [0, model context " + std::to_string(model.context) + "]");
    try {
        parse_device(device);
        check_matmul_precision(matmul);
    } catch (const Error& e) {
        need(false, "[train]." + std::string(e.what()));
    }
    lr_schedule().validate();
    adamw.validate();
    if (!data.tokenizer.empty()) {
        std::unique_ptr<Tokenizer> tokenizer;
        try {
            tokenizer = load_tokenizer(data.tokenizer);
        } catch (const Error& e) {
            need(false, "[data].tokenizer: " + std::string(e.what()));
        }
        need(tokenizer->fits(model.vocab_size),
             "[model].vocab_size " + std::to_string(model.vocab_size) +
                 (model.vocab_size < tokenizer->vocab_size()
                      ? " is below the "
                      : " pads more than " + std::to_string(kMaxPaddingRows) + " rows past the ") +
                 std::to_string(tokenizer->vocab_size()) + " tokens of [data].tokenizer " +
                 data.tokenizer);
    }
    need(data.partition_index < data.partition_count,
         "[data].partition_index must be below partition_count");
}

std::string_view outer_method_name(OuterMethod method) {
    switch (method) {
        case OuterMethod::Ddp: return "ddp";
        case OuterMethod::Local: return "local";
        case OuterMethod::DiLoCo: return "diloco";
        case OuterMethod::NoLoCo: return "noloco";
    }
    return "unknown";
}

OuterMethod outer_method_from_name(std::string_view name) {
    for (OuterMethod m :
         {OuterMethod::Ddp, OuterMethod::Local, OuterMethod::DiLoCo, OuterMethod::NoLoCo}) {
        if (outer_method_name(m) == name) return m;
    }
    throw Error("method \"" + std::string(name) + "\" is not known (ddp, local, diloco, noloco)");
}

void EngineConfig::validate() const {
    train.validate();
    auto need = [](bool ok, const std::string& problem) {
        if (!ok) throw Error("config: " + problem);
    };
    need(inner_steps >= 1, "inner_steps must be at least 1");
    outer.validate();
    need(method != OuterMethod::NoLoCo || exchange.mode != MessageMode::Fused ||
             outer.pull == outer.lr,
         "[exchange].mode = \"fused\" sends theta only, which needs [outer].pull equal to "
         "[outer].lr; use mode = \"split\" for any other pull");
    need(exchange.phi_every >= 1, "[exchange].phi_every must be at least 1");
    need(exchange.phi_every == 1 || exchange.mode == MessageMode::Split,
         "[exchange].phi_every above 1 needs mode = \"split\" (fused messages are theta)");
    need(exchange.delta_codec != codec::Codec::BF16SR,
         "[exchange].delta_codec must be Q8, Q4, F32 or TOPK (BF16SR is a state codec)");
    need(exchange.state_codec != codec::Codec::Q4 && exchange.state_codec != codec::Codec::TOPK,
         "[exchange].state_codec must be BF16SR, Q8 or F32 (Q4 and TOPK are delta codecs)");
}

codec::SparseFormat ExchangeConfig::topk_format() const {
    return codec::sparse_format(topk_chunk, topk_density, topk_value_bits);
}

bool ExchangeConfig::carries_phi(uint64_t round) const {
    return mode == MessageMode::Split && round % phi_every == 0;
}

float ExchangeConfig::delta_feedback_decay() const {
    return delta_codec == codec::Codec::TOPK ? static_cast<float>(feedback_decay) : 1.0f;
}

bool EngineConfig::residual_in_weights() const {
    return method == OuterMethod::DiLoCo && exchange.delta_codec == codec::Codec::TOPK &&
           exchange.error_feedback && exchange.residual_in_weights;
}

std::string EngineConfig::settings_warning() const {
    if (method != OuterMethod::DiLoCo || exchange.delta_codec != codec::Codec::TOPK ||
        inner_steps <= kMaxSparseInnerSteps)
        return {};
    return fmt::format(
        "TOPK deltas in DiLoCo rounds of {} inner steps: phi gains a few percent of each chunk a "
        "round, and rounds of more than {} steps left it far behind Q8's in the study "
        "(docs/compression.md); set fewer inner steps",
        inner_steps, kMaxSparseInnerSteps);
}

float EngineConfig::delta_feedback_decay() const {
    return residual_in_weights() ? 0.0f : exchange.delta_feedback_decay();
}

}  // namespace starling
