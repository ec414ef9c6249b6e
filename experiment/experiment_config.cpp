#include "experiment/experiment_config.h"

#include "common/error.h"
#include "engine/config_reader.h"

namespace starling {

namespace {

void need(bool ok, const std::string& problem) {
    if (!ok) throw Error("config: " + problem);
}

}  // namespace

void ExperimentConfig::validate() const {
    EngineConfig::validate();
    need(replicas >= 2 && replicas <= 64, "[experiment].replicas must be in [2, 64]");
    need(train.steps % inner_steps == 0,
         "[train].steps (" + std::to_string(train.steps) +
             ") must be a whole number of rounds of [experiment].inner_steps (" +
             std::to_string(inner_steps) + ")");
    need(group_size >= 2 && group_size <= replicas,
         "[experiment].group_size must be in [2, replicas]");
    need(eval_every >= 1, "[experiment].eval_every must be at least 1");
    need(overlap_steps >= 0 && overlap_steps <= inner_steps,
         "[experiment].overlap_steps must be in [0, inner_steps]");
    need(overlap_steps == 0 || method == OuterMethod::NoLoCo || method == OuterMethod::DiLoCo,
         "[experiment].overlap_steps needs an outer step to delay: method noloco or diloco");
    need(!out_dir.empty() && !name.empty(), "[experiment].out_dir and name must not be empty");
    need(name.find('/') == std::string::npos, "[experiment].name must not contain '/'");
    need(!churn.enabled || (churn.mean_up_steps > 0.0 && churn.down_steps >= 1),
         "[churn].mean_up_steps must be positive and down_steps at least 1");
}

ExperimentConfig load_experiment_config(const std::string& path) {
    const toml::table root = parse_config_file(path);
    check_config_sections(path, root,
                          {"model", "train", "optimizer", "data", "eval", "experiment", "outer",
                           "exchange", "churn"});
    auto section = [&](const char* name) { return config_section(path, root, name); };

    ExperimentConfig c;
    TableReader m = section("model");
    read_model_section(m, c.train.model);
    TableReader t = section("train");
    read_train_section(t, c.train);
    TableReader o = section("optimizer");
    read_optimizer_section(o, c.train);

    TableReader d = section("data");
    d.read("dir", c.train.data.dir);
    d.reject_unknown();

    TableReader e = section("eval");
    e.read("every", c.eval_every);
    e.read("batches", c.train.eval_batches);
    e.reject_unknown();

    TableReader x = section("experiment");
    read_named(x, "method", c.method, outer_method_name, outer_method_from_name);
    x.read("replicas", c.replicas);
    x.read("inner_steps", c.inner_steps);
    x.read("group_size", c.group_size);
    x.read("overlap_steps", c.overlap_steps);
    x.read("out_dir", c.out_dir);
    x.read("name", c.name);
    x.reject_unknown();

    TableReader u = section("outer");
    read_outer_section(u, c.outer);
    TableReader g = section("exchange");
    read_exchange_section(g, c.exchange);

    TableReader h = section("churn");
    h.read("enabled", c.churn.enabled);
    h.read("mean_up_steps", c.churn.mean_up_steps);
    h.read("down_steps", c.churn.down_steps);
    h.read("seed", c.churn.seed);
    h.reject_unknown();

    try {
        c.validate();
    } catch (const Error& err) {
        throw Error(path + ": " + err.what());
    }
    return c;
}

}  // namespace starling
