// Every config key declared once: its section, its name, the field it sets, the range its value
// must lie in and a line of help. The default is the field's own initial value. One declaration
// drives reading the TOML file and its STARLING_<SECTION>_<KEY> overrides (ConfigFileReader,
// engine/config_reader.h), checking ranges (check_key_ranges), and the key tables of `--help`,
// `starling config keys` and the READMEs (describe_keys).
//
// A visitor is anything with
//   void section(const char* name);                        // the keys that follow are its
//   void operator()(const char* key, Field field, const char* help, KeyRange range = {});
//   void accepted(const char* key, const char* help);      // taken and ignored
// where Field is a reference to a bool, an integer, a float, a double, a std::string, a path or a
// vector of strings or of doubles, or one of the wrappers below for values written in another
// unit or as a name. The range of a vector of numbers holds for each element.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "engine/config.h"

namespace starling {

// Where a number must lie (inclusive bounds, or above an exclusive lower one), or that a string
// must not be empty. The default allows anything.
struct KeyRange {
    double min = -std::numeric_limits<double>::infinity();
    double max = std::numeric_limits<double>::infinity();
    bool min_excluded = false;
    bool max_excluded = false;
    bool non_empty = false;

    bool holds(double value) const;
    bool any() const;
    std::string text() const;  // "at least 1", "in [0, 1)", "above 0", "not empty", "" for any
    std::string requirement() const;  // "must be at least 1", "must not be negative", ...
};
KeyRange at_least(double min);
KeyRange above(double min);
KeyRange in_range(double min, double max);           // [min, max]
KeyRange in_range_open_max(double min, double max);  // [min, max)
KeyRange in_range_open_min(double min, double max);  // (min, max]
KeyRange non_empty();

// Milliseconds written as an integer.
struct Milliseconds {
    std::chrono::milliseconds& value;
};
// A link rate kept in bytes per second and written in Mbit/s.
struct MegabitsPerSecond {
    double& bytes_per_s;
};
// An enum written as one of its names.
template <typename E>
struct Named {
    E& value;
    std::string_view (*name_of)(E);
    E (*from_name)(std::string_view);
};

// One key as the tables show it; default_value is written as in TOML ("" for an accepted key).
struct KeyDescription {
    std::string section, key, default_value, range, help;
};

// The engine's sections, shared by `starling train`, the experiment and starlingd.
template <class V>
void visit_model_keys(V& v, ModelConfig& m) {
    v.section("model");
    v("n_layer", m.n_layer, "transformer blocks", at_least(1));
    v("n_head", m.n_head, "attention heads; d_model / n_head must be even (RoPE)", at_least(1));
    v("d_model", m.d_model, "width of the residual stream", at_least(1));
    v("d_ff", m.d_ff, "width of the SwiGLU feed-forward layer", at_least(1));
    v("vocab_size", m.vocab_size, "token ids (uint16 in the shards)", in_range(2, 65536));
    v("context", m.context, "longest sequence, in tokens", at_least(1));
    v("tied_embeddings", m.tied_embeddings, "the output layer reuses the token embedding");
    v("rope_theta", m.rope_theta, "RoPE base", above(0));
    v("norm_eps", m.norm_eps, "RMSNorm epsilon", above(0));
    v("init_std", m.init_std, "standard deviation of the initial weights", above(0));
}

template <class V>
void visit_train_keys(V& v, TrainConfig& c) {
    v.section("train");
    v("batch_size", c.batch_size, "sequences per inner step on this node", at_least(1));
    v("seq_len", c.seq_len, "tokens per sequence; 0: the model's context", at_least(0));
    v("steps", c.steps, "inner steps: the schedule's length and the token budget", at_least(1));
    v("seed", c.seed, "initialisation seed; every replica of a swarm starts from it");
    v("threads", c.threads, "CPU threads; 0: all cores", at_least(0));
    v("device", c.device, "auto, cpu, cuda, cuda:N, cuda:N,M,... or cuda:all", non_empty());
    v("matmul", c.matmul, "matrix products on a GPU: fp32, tf32 or bf16", non_empty());
}

template <class V>
void visit_optimizer_keys(V& v, TrainConfig& c) {
    v.section("optimizer");
    v("lr", c.schedule.max_lr, "AdamW's peak learning rate", above(0));
    v("warmup_steps", c.schedule.warmup_steps, "steps of linear warmup before the cosine decay",
      at_least(0));
    v("min_lr_fraction", c.schedule.min_lr_fraction, "the last step's lr over the peak",
      in_range(0, 1));
    v("beta1", c.adamw.beta1, "AdamW's first-moment decay", in_range_open_max(0, 1));
    v("beta2", c.adamw.beta2, "AdamW's second-moment decay", in_range_open_max(0, 1));
    v("eps", c.adamw.eps, "AdamW's epsilon", above(0));
    v("weight_decay", c.adamw.weight_decay, "decoupled, on matrices only", at_least(0));
    v("grad_clip", c.adamw.grad_clip, "global gradient norm clip; 0: none", at_least(0));
}

// [data]; `dir_only` for the experiment, whose replicas take their partitions by index.
template <class V>
void visit_data_keys(V& v, DataConfig& d, bool dir_only = false) {
    v.section("data");
    v("dir", d.dir, "prepared shards (starling data prepare)", non_empty());
    if (dir_only) return;
    v("tokenizer", d.tokenizer, "the tokenizer.json the shards were made with; \"\": bytes");
    v("node_id", d.node_id, "seeds this run's data order (starlingd: its node id instead)");
    v("partition_index", d.partition_index, "which disjoint part of the data this run reads");
    v("partition_count", d.partition_count, "into how many parts the data is cut", at_least(1));
}

template <class V>
void visit_outer_keys(V& v, OuterConfig& o) {
    v.section("outer");
    v("momentum", o.momentum, "outer momentum (alpha, mu)", in_range_open_max(0, 1));
    v("lr", o.lr, "outer learning rate (beta, eta)", above(0));
    v("pull", o.pull, "NoLoCo's pull towards the group's phi (gamma)", at_least(0));
    v("form", Named<MomentumForm>{o.form, momentum_form_name, momentum_form_from_name},
      "heavyball or nesterov");
}

template <class V>
void visit_exchange_keys(V& v, ExchangeConfig& x) {
    v.section("exchange");
    v("mode", Named<MessageMode>{x.mode, message_mode_name, message_mode_from_name},
      "NoLoCo's messages: fused (theta; needs pull = lr) or split (D and phi; a dense D is "
      "judged for alignment: docs/security.md)");
    v("state_codec", Named<codec::Codec>{x.state_codec, codec::codec_name, codec::codec_from_name},
      "codec of theta and phi: BF16SR, Q8 or F32");
    v("delta_codec", Named<codec::Codec>{x.delta_codec, codec::codec_name, codec::codec_from_name},
      "codec of D: Q8, Q4, F32 or TOPK (sparse: the largest values of each chunk)");
    v("error_feedback", x.error_feedback, "carry what a delta message lost into the next");
    v("feedback_decay", x.feedback_decay,
      "with TOPK: the share of the unsent residual a round keeps (not where DiLoCo keeps it in "
      "the weights)",
      in_range(0, 1));
    v("residual_in_weights", x.residual_in_weights,
      "DiLoCo with TOPK: each round restarts from phi plus what the member's message left unsent");
    v("phi_every", x.phi_every,
      "split NoLoCo: phi goes with D every this many rounds; the others send D alone, no pull",
      at_least(1));
    v("update_sample", x.update_sample,
      "fused NoLoCo: theta and phi at this many coordinates drawn from the round go beside theta "
      "(8 bytes each), so that partners judge the update there (docs/security.md); 0: none");
    v("topk_chunk", x.topk_chunk, "TOPK: values per chunk", in_range(64, 32768));
    v("topk_density", x.topk_density, "TOPK: share of each chunk's values sent",
      in_range_open_min(0, 1));
    v("topk_value_bits", x.topk_value_bits, "TOPK: bits per value sent (sign and magnitude)",
      in_range(2, 8));
    v("zstd", x.zstd, "compress each chunk where it saves 5%");
}

// The method and H, in the experiment's [experiment] section and starlingd's [swarm].
template <class V>
void visit_round_keys(V& v, EngineConfig& c) {
    v("method", Named<OuterMethod>{c.method, outer_method_name, outer_method_from_name},
      "noloco (groups), diloco (all-gather of D), local (no exchange); ddp (gradients averaged "
      "every step) in the experiment only");
    v("inner_steps", c.inner_steps, "H: inner steps per round", at_least(1));
}

// [eval] batches, which every program's [eval] section holds.
template <class V>
void visit_eval_batches_key(V& v, TrainConfig& c) {
    v("batches", c.eval_batches, "validation batches scored: the first of the split, in order",
      at_least(1));
}

// `starling train`'s own sections: progress lines, evaluations and checkpoints, in steps.
template <class V>
void visit_trainer_keys(V& v, TrainConfig& c) {
    v.section("log");
    v("every", c.log_every, "steps between progress lines", at_least(1));
    v.section("eval");
    v("every", c.eval_every, "steps between validation losses; 0: only at the end", at_least(0));
    visit_eval_batches_key(v, c);
    v.section("checkpoint");
    v("dir", c.run_dir, "the run's checkpoint directory", non_empty());
    v("every", c.checkpoint_every, "steps between checkpoints; 0: only at the end", at_least(0));
    v("keep", c.keep_checkpoints, "newest checkpoints kept", at_least(1));
    v("resume", c.resume, "continue from the newest checkpoint in dir");
}

// Every key of a `starling train` config.
template <class V>
void visit_train_config(V& v, TrainConfig& c) {
    visit_model_keys(v, c.model);
    visit_train_keys(v, c);
    visit_optimizer_keys(v, c);
    visit_data_keys(v, c.data);
    visit_trainer_keys(v, c);
}

// Throws starling::Error "config: [section].key must be ..." for the first value out of range.
class KeyRangeChecker {
public:
    void section(const char* name) { section_ = name; }
    template <typename Field>
    void operator()(const char* key, Field&& field, const char*, KeyRange range = {}) {
        check(key, field, range);
    }
    void accepted(const char*, const char*) {}

private:
    void check_number(const char* key, double value, const KeyRange& range) const;
    void check(const char* key, const std::string& value, const KeyRange& range) const;
    void check(const char* key, const std::filesystem::path& value, const KeyRange& range) const {
        check(key, value.string(), range);
    }
    void check(const char*, const std::vector<std::string>&, const KeyRange&) const {}
    void check(const char* key, const std::vector<double>& values, const KeyRange& range) const {
        for (const double value : values) check_number(key, value, range);
    }
    void check(const char*, bool, const KeyRange&) const {}
    void check(const char* key, const Milliseconds& ms, const KeyRange& range) const {
        check_number(key, static_cast<double>(ms.value.count()), range);
    }
    void check(const char* key, const MegabitsPerSecond& rate, const KeyRange& range) const {
        check_number(key, rate.bytes_per_s * 8 / 1e6, range);
    }
    template <typename E>
    void check(const char*, const Named<E>&, const KeyRange&) const {}
    template <typename N>
    void check(const char* key, const N& value, const KeyRange& range) const {
        static_assert(std::is_arithmetic_v<N>, "a config key of an unknown kind");
        check_number(key, static_cast<double>(value), range);
    }

    std::string section_;
};

// Collects the description of every key a visit declares, defaults read from the fields.
class KeyDescriber {
public:
    void section(const char* name) { section_ = name; }
    template <typename Field>
    void operator()(const char* key, Field&& field, const char* help, KeyRange range = {}) {
        keys.push_back({section_, key, show(field), range.text(), help});
    }
    void accepted(const char* key, const char* help) {
        keys.push_back({section_, key, "", "", help});
    }

    std::vector<KeyDescription> keys;

private:
    static std::string show(const std::string& value);
    static std::string show(const std::filesystem::path& value) { return show(value.string()); }
    static std::string show(const std::vector<std::string>& value);
    static std::string show(const std::vector<double>& value);
    static std::string show(bool value) { return value ? "true" : "false"; }
    static std::string show(double value);
    static std::string show(float value);
    static std::string show(const Milliseconds& ms) { return std::to_string(ms.value.count()); }
    static std::string show(const MegabitsPerSecond& rate) {
        return show(rate.bytes_per_s * 8 / 1e6);
    }
    template <typename E>
    static std::string show(const Named<E>& named) {
        return show(std::string(named.name_of(named.value)));
    }
    template <typename N>
    static std::string show(const N& value) {
        static_assert(std::is_integral_v<N>, "a config key of an unknown kind");
        return std::to_string(value);
    }

    std::string section_;
};

// "[section].key: help (range)", for a command-line flag that sets the key; throws starling::Error
// when no such key is declared.
std::string key_help(const std::vector<KeyDescription>& keys, std::string_view section,
                     std::string_view key);

// The keys as text for --help (one line each) or as Markdown tables, one per section.
std::string keys_as_text(const std::vector<KeyDescription>& keys);
std::string keys_as_markdown(const std::vector<KeyDescription>& keys);

}  // namespace starling
