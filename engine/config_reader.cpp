#include "engine/config_reader.h"

#include <mutex>

extern char** environ;

namespace starling {

namespace {

struct ConsultedVariables {
    std::mutex mutex;
    std::set<std::string> names;
};

ConsultedVariables& consulted_variables() {
    static ConsultedVariables consulted;
    return consulted;
}

// STARLING_* variables read outside the config files.
constexpr std::string_view kOtherVariables[] = {"STARLING_CONTROL", "STARLING_EMULATED_DEVICES",
                                                "STARLING_EMULATION_ORDER"};

}  // namespace

void note_config_variable(const std::string& name) {
    ConsultedVariables& consulted = consulted_variables();
    std::lock_guard lock(consulted.mutex);
    consulted.names.insert(name);
}

std::vector<std::string> unknown_starling_variables() {
    ConsultedVariables& consulted = consulted_variables();
    std::lock_guard lock(consulted.mutex);
    std::vector<std::string> unknown;
    for (char** entry = environ; *entry != nullptr; entry++) {
        const std::string_view text(*entry);
        const std::string name(text.substr(0, text.find('=')));
        if (name.rfind("STARLING_", 0) != 0 || consulted.names.count(name)) continue;
        if (std::find(std::begin(kOtherVariables), std::end(kOtherVariables), name) !=
            std::end(kOtherVariables))
            continue;
        unknown.push_back(name);
    }
    std::sort(unknown.begin(), unknown.end());
    return unknown;
}

toml::table parse_config_file(const std::string& path) {
    try {
        return toml::parse_file(path);
    } catch (const toml::parse_error& e) {
        const auto& where = e.source().begin;
        throw Error(path + ":" + std::to_string(where.line) + ":" + std::to_string(where.column) +
                    ": " + std::string(e.description()));
    }
}

void check_config_sections(const std::string& path, const toml::table& root,
                           const std::vector<std::string>& known) {
    for (const auto& [key, node] : root) {
        const std::string name(key.str());
        if (std::find(known.begin(), known.end(), name) == known.end() || !node.is_table()) {
            std::string list;
            for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
            throw Error(path + ": unknown section [" + name + "] (known: " + list + ")");
        }
    }
}

TableReader config_section(const std::string& path, const toml::table& root, const char* name) {
    return TableReader(path, name, root[name].as_table());
}

void read_model_section(TableReader& m, ModelConfig& model) {
    m.read("n_layer", model.n_layer);
    m.read("n_head", model.n_head);
    m.read("d_model", model.d_model);
    m.read("d_ff", model.d_ff);
    m.read("vocab_size", model.vocab_size);
    m.read("context", model.context);
    m.read("tied_embeddings", model.tied_embeddings);
    m.read("rope_theta", model.rope_theta);
    m.read("norm_eps", model.norm_eps);
    m.read("init_std", model.init_std);
    m.reject_unknown();
}

void read_train_section(TableReader& t, TrainConfig& c) {
    t.read("batch_size", c.batch_size);
    t.read("seq_len", c.seq_len);
    t.read("steps", c.steps);
    t.read("seed", c.seed);
    t.read("threads", c.threads);
    t.read("device", c.device);
    t.read("matmul", c.matmul);
    t.reject_unknown();
}

void read_optimizer_section(TableReader& o, TrainConfig& c) {
    o.read("lr", c.schedule.max_lr);
    o.read("warmup_steps", c.schedule.warmup_steps);
    o.read("min_lr_fraction", c.schedule.min_lr_fraction);
    o.read("beta1", c.adamw.beta1);
    o.read("beta2", c.adamw.beta2);
    o.read("eps", c.adamw.eps);
    o.read("weight_decay", c.adamw.weight_decay);
    o.read("grad_clip", c.adamw.grad_clip);
    o.reject_unknown();
}

void read_engine_sections(const std::string& path, const toml::table& root, TrainConfig& c) {
    TableReader m = config_section(path, root, "model");
    read_model_section(m, c.model);
    TableReader t = config_section(path, root, "train");
    read_train_section(t, c);
    TableReader o = config_section(path, root, "optimizer");
    read_optimizer_section(o, c);
    TableReader d = config_section(path, root, "data");
    d.read("dir", c.data.dir);
    d.read("tokenizer", c.data.tokenizer);
    d.read("node_id", c.data.node_id);
    d.read("partition_index", c.data.partition_index);
    d.read("partition_count", c.data.partition_count);
    d.reject_unknown();
}

void read_outer_section(TableReader& u, OuterConfig& outer) {
    u.read("momentum", outer.momentum);
    u.read("lr", outer.lr);
    u.read("pull", outer.pull);
    read_named(u, "form", outer.form, momentum_form_name, momentum_form_from_name);
    u.reject_unknown();
}

void read_exchange_section(TableReader& g, ExchangeConfig& exchange) {
    read_named(g, "mode", exchange.mode, message_mode_name, message_mode_from_name);
    read_named(g, "state_codec", exchange.state_codec, codec::codec_name, codec::codec_from_name);
    read_named(g, "delta_codec", exchange.delta_codec, codec::codec_name, codec::codec_from_name);
    g.read("error_feedback", exchange.error_feedback);
    g.read("zstd", exchange.zstd);
    g.reject_unknown();
}

}  // namespace starling
