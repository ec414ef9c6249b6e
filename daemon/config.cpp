#include "daemon/config.h"

#include <cctype>
#include <cstdlib>
#include <limits>
#include <set>
#include <toml++/toml.h>

#include "common/error.h"

namespace starling {

namespace {

// Reads typed keys out of one TOML table and remembers which were used, so leftovers can be
// reported as unknown. An environment variable STARLING_<SECTION>_<KEY> (e.g. STARLING_TRAIN_STEPS)
// overrides the file; its value is read as a TOML value, except for strings, taken as they are.
class TableReader {
public:
    TableReader(const std::string& file, const std::string& section, const toml::table* table)
        : file_(file), section_(section), table_(table) {}

    template <typename V>
    void read(const char* key, V& out) {
        known_.insert(key);
        if (const toml::node* node = table_ ? table_->get(key) : nullptr) {
            assign(*node, out, file_ + ": [" + section_ + "]." + key);
        }
        const std::string variable = environment_name(key);
        const char* value = std::getenv(variable.c_str());
        if (!value) return;
        const std::string where = "environment variable " + variable + "=" + value;
        if constexpr (std::is_same_v<V, std::string>) {
            out = value;
        } else {
            toml::table parsed;
            try {
                parsed = toml::parse("v = " + std::string(value));
            } catch (const toml::parse_error&) {
                throw Error(where + ": not a valid value");
            }
            assign(*parsed.get("v"), out, where);
        }
    }

    void reject_unknown() const {
        if (!table_) return;
        for (const auto& [key, node] : *table_) {
            if (!known_.count(std::string(key.str()))) {
                std::string list;
                for (const std::string& k : known_) list += (list.empty() ? "" : ", ") + k;
                throw Error(file_ + ": unknown key [" + section_ + "]." + std::string(key.str()) +
                            " (known keys: " + list + ")");
            }
        }
    }

private:
    std::string environment_name(const char* key) const {
        std::string name = "STARLING_" + section_ + "_" + key;
        for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        return name;
    }

    template <typename V>
    static void assign(const toml::node& node, V& out, const std::string& where) {
        auto fail = [&](const char* problem) { throw Error(where + " " + problem); };
        if constexpr (std::is_same_v<V, bool>) {
            if (!node.is_boolean()) fail("must be true or false");
            out = node.as_boolean()->get();
        } else if constexpr (std::is_same_v<V, std::string>) {
            if (!node.is_string()) fail("must be a string");
            out = node.as_string()->get();
        } else if constexpr (std::is_floating_point_v<V>) {
            if (!node.is_number()) fail("must be a number");
            out = static_cast<V>(node.value<double>().value());
        } else {
            if (!node.is_integer()) fail("must be an integer");
            const int64_t v = node.as_integer()->get();
            if (v < static_cast<int64_t>(std::numeric_limits<V>::min()) ||
                (v > 0 && static_cast<uint64_t>(v) > std::numeric_limits<V>::max())) {
                fail("is out of range");
            }
            out = static_cast<V>(v);
        }
    }

    std::string file_, section_;
    const toml::table* table_;
    std::set<std::string> known_;
};

}  // namespace

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
    need(device == "auto" || device == "cpu",
         "[train].device \"" + device + "\" is not available in this build (use \"auto\" or \"cpu\")");
    lr_schedule().validate();
    adamw.validate();
    need(!data.dir.empty(), "[data].dir must not be empty");
    need(data.partition_count >= 1 && data.partition_index < data.partition_count,
         "[data].partition_index must be below partition_count");
    need(log_every >= 1, "[log].every must be at least 1");
    need(eval_every >= 0, "[eval].every must not be negative");
    need(eval_batches >= 1, "[eval].batches must be at least 1");
    need(!run_dir.empty(), "[checkpoint].dir must not be empty");
    need(checkpoint_every >= 0, "[checkpoint].every must not be negative");
    need(keep_checkpoints >= 1, "[checkpoint].keep must be at least 1");
}

TrainConfig load_train_config(const std::string& path) {
    toml::table root;
    try {
        root = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
        const auto& where = e.source().begin;
        throw Error(path + ":" + std::to_string(where.line) + ":" + std::to_string(where.column) +
                    ": " + std::string(e.description()));
    }
    const std::set<std::string> sections = {"model", "train", "optimizer", "data",
                                            "log",   "eval",  "checkpoint"};
    for (const auto& [key, node] : root) {
        if (!sections.count(std::string(key.str())) || !node.is_table()) {
            throw Error(path + ": unknown section [" + std::string(key.str()) +
                        "] (known: model, train, optimizer, data, log, eval, checkpoint)");
        }
    }
    auto section = [&](const char* name) { return TableReader(path, name, root[name].as_table()); };

    TrainConfig c;
    TableReader m = section("model");
    m.read("n_layer", c.model.n_layer);
    m.read("n_head", c.model.n_head);
    m.read("d_model", c.model.d_model);
    m.read("d_ff", c.model.d_ff);
    m.read("vocab_size", c.model.vocab_size);
    m.read("context", c.model.context);
    m.read("tied_embeddings", c.model.tied_embeddings);
    m.read("rope_theta", c.model.rope_theta);
    m.read("norm_eps", c.model.norm_eps);
    m.read("init_std", c.model.init_std);
    m.reject_unknown();

    TableReader t = section("train");
    t.read("batch_size", c.batch_size);
    t.read("seq_len", c.seq_len);
    t.read("steps", c.steps);
    t.read("seed", c.seed);
    t.read("threads", c.threads);
    t.read("device", c.device);
    t.reject_unknown();

    TableReader o = section("optimizer");
    o.read("lr", c.schedule.max_lr);
    o.read("warmup_steps", c.schedule.warmup_steps);
    o.read("min_lr_fraction", c.schedule.min_lr_fraction);
    o.read("beta1", c.adamw.beta1);
    o.read("beta2", c.adamw.beta2);
    o.read("eps", c.adamw.eps);
    o.read("weight_decay", c.adamw.weight_decay);
    o.read("grad_clip", c.adamw.grad_clip);
    o.reject_unknown();

    TableReader d = section("data");
    d.read("dir", c.data.dir);
    d.read("node_id", c.data.node_id);
    d.read("partition_index", c.data.partition_index);
    d.read("partition_count", c.data.partition_count);
    d.reject_unknown();

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
