#include "daemon/config.h"

#include <mutex>

#include "daemon/config_reader.h"
#include "data/tokenizer.h"
#include "kernels/backend.h"

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

TrainConfig load_train_config(const std::string& path) {
    const toml::table root = parse_config_file(path);
    check_config_sections(path, root,
                          {"model", "train", "optimizer", "data", "log", "eval", "checkpoint",
                           // starlingd's sections (daemon/swarm/node_config.h), not used here
                           "node", "swarm", "outer", "exchange", "peer", "control", "metrics"});
    auto section = [&](const char* name) { return config_section(path, root, name); };

    TrainConfig c;
    read_engine_sections(path, root, c);

    TableReader l = section("log");
    l.read("every", c.log_every);
    l.reject_unknown();

    TableReader e = section("eval");
    e.read("every", c.eval_every);
    e.read("batches", c.eval_batches);
    e.reject_unknown();

    TableReader k = section("checkpoint");
    k.read("dir", c.run_dir);
    k.read("every", c.checkpoint_every);
    k.read("keep", c.keep_checkpoints);
    k.read("resume", c.resume);
    k.reject_unknown();

    try {
        c.validate();
    } catch (const Error& err) {
        throw Error(path + ": " + err.what());
    }
    return c;
}

}  // namespace starling
