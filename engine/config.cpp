#include "engine/config.h"

#include <memory>

#include "common/error.h"
#include "data/tokenizer.h"
#include "kernels/backend.h"

namespace starling {

void TrainConfig::validate() const {
    model.validate();
    auto need = [](bool ok, const std::string& problem) {
        if (!ok) throw Error("config: " + problem);
    };
    need(batch_size >= 1, "[train].batch_size must be at least 1");
    need(seq_len >= 0 && seq_len <= model.context,
         "[train].seq_len must be in [0, model context " + std::to_string(model.context) + "]");
    need(steps >= 1, "[train].steps must be at least 1");
    need(threads >= 0, "[train].threads must not be negative");
    try {
        parse_device(device);
        check_matmul_precision(matmul);
    } catch (const Error& e) {
        need(false, "[train]." + std::string(e.what()));
    }
    lr_schedule().validate();
    adamw.validate();
    need(!data.dir.empty(), "[data].dir must not be empty");
    if (!data.tokenizer.empty()) {
        std::unique_ptr<Tokenizer> tokenizer;
        try {
            tokenizer = load_tokenizer(data.tokenizer);
        } catch (const Error& e) {
            need(false, "[data].tokenizer: " + std::string(e.what()));
        }
        need(tokenizer->fits(model.vocab_size),
             "[model].vocab_size " + std::to_string(model.vocab_size) + " is below the " +
                 std::to_string(tokenizer->vocab_size()) + " tokens of [data].tokenizer " +
                 data.tokenizer);
    }
    need(data.partition_count >= 1 && data.partition_index < data.partition_count,
         "[data].partition_index must be below partition_count");
    need(log_every >= 1, "[log].every must be at least 1");
    need(eval_every >= 0, "[eval].every must not be negative");
    need(eval_batches >= 1, "[eval].batches must be at least 1");
    need(!run_dir.empty(), "[checkpoint].dir must not be empty");
    need(checkpoint_every >= 0, "[checkpoint].every must not be negative");
    need(keep_checkpoints >= 1, "[checkpoint].keep must be at least 1");
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
    need(exchange.delta_codec != codec::Codec::BF16SR,
         "[exchange].delta_codec must be Q8, Q4 or F32 (BF16SR is a state codec)");
    need(exchange.state_codec != codec::Codec::Q4,
         "[exchange].state_codec must be BF16SR, Q8 or F32 (Q4 is a delta codec)");
}

}  // namespace starling
