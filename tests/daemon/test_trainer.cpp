// End-to-end training on the real corpus: it learns, it resumes bit for bit, and bad files give
// clear errors.
#include <catch2/catch.hpp>
#include <filesystem>

#include "daemon/config.h"
#include "daemon/trainer.h"
#include "common/error.h"
#include "tests/support/files.h"
#include "tests/support/kjv.h"

using namespace starling;
using namespace starling::test;
namespace fs = std::filesystem;

namespace {

TrainConfig pico(const std::string& run_name, int64_t steps) {
    TrainConfig c = load_train_config(std::string(STARLING_SOURCE_DIR) + "/configs/pico.toml");
    c.data.dir = kjv_dir();
    c.run_dir = (scratch_root() / run_name).string();
    fs::remove_all(c.run_dir);
    c.steps = steps;
    c.schedule.warmup_steps = std::min<int64_t>(c.schedule.warmup_steps, steps / 4);
    c.eval_every = 0;
    c.checkpoint_every = 0;
    c.threads = 2;
    return c;
}

}  // namespace

TEST_CASE("pico learns the KJV: validation loss falls below 2.5 nats per byte") {
    TrainConfig c = pico("learns", 600);
    c.eval_batches = 32;
    Trainer trainer(c);
    const double before = trainer.evaluate();
    CHECK(before > 5.0);  // about log(256) = 5.55 from a fresh init
    const TrainSummary summary = trainer.run();
    REQUIRE(summary.val_loss.has_value());
    INFO("val loss " << before << " -> " << *summary.val_loss);
    CHECK(*summary.val_loss < 2.5);
    CHECK(summary.steps.size() == 600);
    CHECK(fs::exists(fs::path(c.run_dir) / "step_00000600" / "model.safetensors"));
    CHECK(fs::exists(fs::path(c.run_dir) / "step_00000600" / "config.json"));
}

TEST_CASE("save, reload and continue gives the same losses bit for bit") {
    const int64_t total = 40;
    TrainConfig straight_cfg = pico("straight", total);
    Trainer straight(straight_cfg);
    const TrainSummary reference = straight.run();
    REQUIRE(reference.steps.size() == total);

    TrainConfig split_cfg = pico("split", total);
    {
        Trainer first(split_cfg);
        first.run(total / 2);
        first.save_checkpoint();
    }
    Trainer second(split_cfg);
    CHECK(second.resumed());
    CHECK(second.step() == total / 2);
    const TrainSummary rest = second.run();
    REQUIRE(rest.steps.size() == total / 2);
    for (size_t i = 0; i < rest.steps.size(); i++) {
        const StepRecord& a = reference.steps[total / 2 + i];
        const StepRecord& b = rest.steps[i];
        INFO("step " << b.step);
        REQUIRE(a.step == b.step);
        CHECK(a.loss == b.loss);
        CHECK(a.grad_norm == b.grad_norm);
        CHECK(a.lr == b.lr);
    }
    CHECK(*reference.val_loss == *rest.val_loss);
    const size_t n = straight.model().num_params();
    CHECK(std::equal(straight.model().params(), straight.model().params() + n,
                     second.model().params()));
}

TEST_CASE("bad checkpoints and data give errors that name the file") {
    TrainConfig c = pico("bad", 4);
    Trainer(c).run();
    const fs::path ckpt = fs::path(c.run_dir) / "step_00000004";

    SECTION("a config that does not match the checkpoint") {
        TrainConfig other = c;
        other.model.n_layer = 3;
        CHECK_THROWS_WITH(Trainer(other),
                          Catch::Contains("config.json") && Catch::Contains("does not match"));
    }
    SECTION("a truncated model file") {
        fs::resize_file(ckpt / "model.safetensors", 1000);
        CHECK_THROWS_WITH(Trainer(c), Catch::Contains((ckpt / "model.safetensors").string()));
    }
    SECTION("a corrupt training state") {
        put(ckpt / "training_state.safetensors", "garbage!garbage!");
        CHECK_THROWS_WITH(Trainer(c),
                          Catch::Contains((ckpt / "training_state.safetensors").string()));
    }
    SECTION("a different seed than the checkpoint") {
        TrainConfig other = c;
        other.seed = 99;
        CHECK_THROWS_WITH(Trainer(other), Catch::Contains("seed"));
    }
    SECTION("a data directory without shards") {
        TrainConfig other = c;
        other.data.dir = (scratch_root() / "nothing-here").string();
        CHECK_THROWS_WITH(Trainer(other), Catch::Contains("nothing-here"));
    }
}
