#include "experiment/experiment_config.h"

#include "common/error.h"
#include "engine/config_reader.h"

namespace starling {

namespace {

void need(bool ok, const std::string& problem) {
    if (!ok) throw Error("config: " + problem);
}

template <class V>
void visit_experiment_config(V& v, ExperimentConfig& c) {
    visit_model_keys(v, c.train.model);
    visit_train_keys(v, c.train);
    visit_optimizer_keys(v, c.train);
    visit_data_keys(v, c.train.data, true);
    v.section("eval");
    v("every", c.eval_every, "rounds between validation losses of every replica's phi",
      at_least(1));
    visit_eval_batches_key(v, c.train);
    v.section("experiment");
    visit_round_keys(v, c);
    v("replicas", c.replicas, "N: replicas trained side by side", in_range(2, 64));
    v("group_size", c.group_size, "NoLoCo's group size, at most replicas", at_least(2));
    v("overlap_steps", c.overlap_steps,
      "inner steps of the next round before an outer step lands (docs/overlap.md); 0: "
      "sequential rounds, at most inner_steps",
      at_least(0));
    v("speeds", c.speeds,
      "each replica's speed relative to 1, for the simulated clock and token-budget rounds; []: "
      "all 1",
      above(0));
    v("round_budget", Named<RoundBudget>{c.round_budget, round_budget_name, round_budget_from_name},
      "steps (every replica takes inner_steps; the fast wait) or tokens (replicas x inner_steps "
      "batches in all, shared by speed; none waits)");
    v("token_weighting", c.token_weighting,
      "weigh each member's values in the outer step by the tokens it trained");
    v("out_dir", c.out_dir, "where <name>.csv and summary.csv go", non_empty());
    v("name", c.name, "the run's name: its CSV's file name", non_empty());
    visit_outer_keys(v, c.outer);
    visit_exchange_keys(v, c.exchange);
    v.section("churn");
    v("enabled", c.churn.enabled, "replicas leave and come back");
    v("mean_up_steps", c.churn.mean_up_steps, "mean of the exponential up-times, in inner steps",
      above(0));
    v("down_steps", c.churn.down_steps, "down-time, in inner steps", at_least(1));
    v("seed", c.churn.seed, "seed of the up-times");
    v.section("fault");
    v("kind", Named<FaultKind>{c.fault.kind, fault_kind_name, fault_kind_from_name},
      "what the faulty members do wrong (experiment/fault.h): none, learning_rate, weight_decay, "
      "garbage_data, non_finite, scaled, sign_flip, noise, free_rider, replay, bias, tokens or echo");
    v("members", c.fault.members, "how many replicas are faulty: the last ones", at_least(1));
    v("scale", c.fault.scale,
      "learning_rate, scaled, tokens: the factor; weight_decay: the decay; bias: its size over "
      "the update's norm",
      above(0));
    v("defences", c.judge_messages,
      "the outer step judges the others' messages (sane(), direction, clip, token caps) and "
      "quarantines; false only to measure what that saves");
}

}  // namespace

std::string_view round_budget_name(RoundBudget budget) {
    return budget == RoundBudget::Tokens ? "tokens" : "steps";
}

RoundBudget round_budget_from_name(std::string_view name) {
    if (name == "steps") return RoundBudget::Steps;
    if (name == "tokens") return RoundBudget::Tokens;
    throw Error("round budget \"" + std::string(name) + "\" is not known (steps, tokens)");
}

void ExperimentConfig::validate() const {
    ExperimentConfig keys = *this;  // the visit takes the fields by reference
    KeyRangeChecker check;
    visit_experiment_config(check, keys);
    EngineConfig::validate();
    need(train.steps % inner_steps == 0,
         "[train].steps (" + std::to_string(train.steps) +
             ") must be a whole number of rounds of [experiment].inner_steps (" +
             std::to_string(inner_steps) + ")");
    need(group_size <= replicas, "[experiment].group_size must be in [2, replicas]");
    need(overlap_steps <= inner_steps, "[experiment].overlap_steps must be in [0, inner_steps]");
    need(overlap_steps == 0 || method == OuterMethod::NoLoCo || method == OuterMethod::DiLoCo,
         "[experiment].overlap_steps needs an outer step to delay: method noloco or diloco");
    need(name.find('/') == std::string::npos, "[experiment].name must not contain '/'");
    need(speeds.empty() || speeds.size() == static_cast<size_t>(replicas),
         "[experiment].speeds must give one speed per replica (" + std::to_string(replicas) +
             "), or none");
    need(fault.kind == FaultKind::None || fault.members < replicas,
         "[fault].members must leave at least one honest replica (at most replicas - 1)");
    need(!fault_alters_messages(fault.kind) || method == OuterMethod::NoLoCo ||
             method == OuterMethod::DiLoCo,
         "[fault].kind \"" + std::string(fault_kind_name(fault.kind)) +
             "\" alters messages: method noloco or diloco");
    need(fault.kind != FaultKind::Echo || method == OuterMethod::NoLoCo,
         "[fault].kind \"echo\" sends back a partner's message: method noloco");
    need(round_budget == RoundBudget::Steps || (method != OuterMethod::Ddp && overlap_steps == 0),
         "[experiment].round_budget = \"tokens\" needs replicas that train apart and sequential "
         "rounds: not method ddp, not overlap_steps");
}

ExperimentConfig load_experiment_config(const std::string& path) {
    return load_config_file<ExperimentConfig>(
        path, [](auto& v, ExperimentConfig& c) { visit_experiment_config(v, c); });
}

std::vector<KeyDescription> experiment_config_keys(ExperimentConfig config) {
    KeyDescriber describe;
    visit_experiment_config(describe, config);
    return describe.keys;
}

}  // namespace starling
