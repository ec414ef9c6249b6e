#include "experiment/experiment_config.h"

#include "common/error.h"
#include "daemon/config_reader.h"

namespace starling {

namespace {

void need(bool ok, const std::string& problem) {
    if (!ok) throw Error("config: " + problem);
}

}  // namespace

std::string_view method_name(Method method) {
    switch (method) {
        case Method::Ddp: return "ddp";
        case Method::Local: return "local";
        case Method::DiLoCo: return "diloco";
        case Method::NoLoCo: return "noloco";
    }
    return "unknown";
}

Method method_from_name(std::string_view name) {
    for (Method m : {Method::Ddp, Method::Local, Method::DiLoCo, Method::NoLoCo}) {
        if (method_name(m) == name) return m;
    }
    throw Error("method \"" + std::string(name) + "\" is not known (ddp, local, diloco, noloco)");
}

void ExperimentConfig::validate() const {
    train.validate();
    need(replicas >= 2 && replicas <= 64, "[experiment].replicas must be in [2, 64]");
    need(inner_steps >= 1, "[experiment].inner_steps must be at least 1");
    need(train.steps % inner_steps == 0,
         "[train].steps (" + std::to_string(train.steps) +
             ") must be a whole number of rounds of [experiment].inner_steps (" +
             std::to_string(inner_steps) + ")");
    need(group_size >= 2 && group_size <= replicas,
         "[experiment].group_size must be in [2, replicas]");
    need(eval_every >= 1, "[experiment].eval_every must be at least 1");
    need(overlap_steps >= 0 && overlap_steps <= inner_steps,
         "[experiment].overlap_steps must be in [0, inner_steps]");
    need(overlap_steps == 0 || method == Method::NoLoCo || method == Method::DiLoCo,
         "[experiment].overlap_steps needs an outer step to delay: method noloco or diloco");
    need(!out_dir.empty() && !name.empty(), "[experiment].out_dir and name must not be empty");
    need(name.find('/') == std::string::npos, "[experiment].name must not contain '/'");
    outer.validate();
    if (method == Method::NoLoCo && exchange.mode == MessageMode::Fused) {
        need(outer.pull == outer.lr,
             "[exchange].mode = \"fused\" sends theta only, which needs [outer].pull equal to "
             "[outer].lr; use mode = \"split\" for any other pull");
    }
    need(exchange.delta_codec != codec::Codec::BF16SR,
         "[exchange].delta_codec must be Q8, Q4 or F32 (BF16SR is a state codec)");
    need(exchange.state_codec != codec::Codec::Q4,
         "[exchange].state_codec must be BF16SR, Q8 or F32 (Q4 is a delta codec)");
    need(!churn.enabled || (churn.mean_up_steps > 0.0 && churn.down_steps >= 1),
         "[churn].mean_up_steps must be positive and down_steps at least 1");
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
    read_named(x, "method", c.method, method_name, method_from_name);
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
