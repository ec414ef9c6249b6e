#include <catch2/catch.hpp>
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "daemon/config.h"
#include "engine/config_reader.h"
#include "data/bpe_trainer.h"
#include "data/corpus.h"
#include "common/error.h"
#include "tests/support/config_keys.h"
#include "tests/support/files.h"

using namespace starling;
using namespace starling::test;
namespace fs = std::filesystem;

namespace {

// Sets a variable for the scope of one check and removes it afterwards.
struct EnvVar {
    const char* name;
    EnvVar(const char* n, const char* value) : name(n) { ::setenv(n, value, 1); }
    ~EnvVar() { ::unsetenv(name); }
};

bool contains(const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
}

// Writes text to a config file in a temporary directory and loads it.
struct ConfigFile {
    TempDir dir;
    fs::path path = dir.file("config.toml");
    explicit ConfigFile(const std::string& text) { put(path, text); }
    TrainConfig load() const { return load_train_config(path.string()); }
};

}  // namespace

TEST_CASE("every shipped config loads and describes the model it promises") {
    const fs::path dir = fs::path(STARLING_SOURCE_DIR) / "configs";
    const TrainConfig pico = load_train_config((dir / "pico.toml").string());
    CHECK(pico.model.n_layer == 2);
    CHECK(pico.model.num_parameters() == 123200);
    CHECK(pico.lr_schedule().total_steps == pico.steps);
    const TrainConfig nano = load_train_config((dir / "nano.toml").string());
    CHECK(nano.model.num_parameters() > 800000);
    CHECK(nano.model.num_parameters() < 1200000);
    const TrainConfig m124 = load_train_config((dir / "124m.toml").string());
    CHECK(m124.model.num_parameters() / 1000000 == 124);
    CHECK(m124.model.context == 1024);
    const TrainConfig b1 = load_train_config((dir / "1b.toml").string());
    CHECK(b1.model.num_parameters() > 1000000000);
}

TEST_CASE("an empty config gives working defaults") {
    ConfigFile f("");
    const TrainConfig c = f.load();
    CHECK(c.model.d_model == 64);
    CHECK(c.effective_seq_len() == c.model.context);
}

TEST_CASE("config errors name the file and the key") {
    SECTION("unknown key") {
        ConfigFile f("[model]\nn_layers = 3\n");
        CHECK_THROWS_WITH(f.load(), Catch::Contains(f.path.string()) &&
                                        Catch::Contains("unknown key [model].n_layers"));
    }
    SECTION("unknown section") {
        ConfigFile f("[modle]\nn_layer = 3\n");
        CHECK_THROWS_WITH(f.load(), Catch::Contains("unknown section [modle]"));
    }
    SECTION("wrong type") {
        ConfigFile f("[train]\nbatch_size = \"eight\"\n");
        CHECK_THROWS_WITH(f.load(), Catch::Contains("[train].batch_size must be an integer"));
    }
    SECTION("out of range") {
        ConfigFile f("[model]\nn_layer = 99999999999\n");
        CHECK_THROWS_WITH(f.load(), Catch::Contains("[model].n_layer is out of range"));
    }
    SECTION("inconsistent values") {
        ConfigFile f("[model]\nd_model = 30\nn_head = 4\n");
        CHECK_THROWS_WITH(f.load(), Catch::Contains("not divisible"));
    }
    SECTION("warmup longer than the run") {
        ConfigFile f("[train]\nsteps = 10\n[optimizer]\nwarmup_steps = 10\n");
        CHECK_THROWS_WITH(f.load(), Catch::Contains("warmup_steps"));
    }
    SECTION("syntax error with line number") {
        ConfigFile f("[model]\nn_layer = = 2\n");
        CHECK_THROWS_WITH(f.load(), Catch::Contains(f.path.string() + ":2"));
    }
    SECTION("unavailable device") {
        ConfigFile f("[train]\ndevice = \"tpu\"\n");
        CHECK_THROWS_WITH(f.load(), Catch::Contains("[train].device"));
    }
    SECTION("unknown matmul precision") {
        ConfigFile f("[train]\nmatmul = \"fp8\"\n");
        CHECK_THROWS_WITH(f.load(), Catch::Contains("[train].matmul precision \"fp8\""));
    }
}

TEST_CASE("a missing config file is an error naming it") {
    CHECK_THROWS_WITH(load_train_config("/nonexistent/starling.toml"),
                      Catch::Contains("/nonexistent/starling.toml"));
}

TEST_CASE("STARLING_<SECTION>_<KEY> environment variables override the file") {
    ConfigFile f("[train]\nsteps = 10\n[data]\ndir = \"from-file\"\n");
    {
        EnvVar steps("STARLING_TRAIN_STEPS", "123");
        EnvVar dir("STARLING_DATA_DIR", "/tmp/shards");
        EnvVar lr("STARLING_OPTIMIZER_LR", "1e-4");
        EnvVar tied("STARLING_MODEL_TIED_EMBEDDINGS", "false");
        const TrainConfig c = f.load();
        CHECK(c.steps == 123);
        CHECK(c.data.dir == "/tmp/shards");
        CHECK(c.schedule.max_lr == Approx(1e-4f));
        CHECK_FALSE(c.model.tied_embeddings);
    }
    CHECK(f.load().steps == 10);
    {
        EnvVar bad("STARLING_MODEL_N_LAYER", "two");
        CHECK_THROWS_WITH(f.load(), Catch::Contains("STARLING_MODEL_N_LAYER=two"));
    }
    {
        EnvVar wrong_type("STARLING_TRAIN_BATCH_SIZE", "1.5");
        CHECK_THROWS_WITH(f.load(), Catch::Contains("STARLING_TRAIN_BATCH_SIZE") &&
                                        Catch::Contains("must be an integer"));
    }
}

TEST_CASE("a STARLING_ variable that no setting reads is reported, the settings' own are not") {
    ConfigFile f("[train]\nsteps = 10\n");
    const EnvVar misspelt("STARLING_TRAIN_STPES", "123");
    const EnvVar right("STARLING_TRAIN_STEPS", "123");
    const EnvVar control("STARLING_CONTROL", "127.0.0.1:7701");
    const EnvVar other("STARLINGX_TRAIN_STEPS", "1");
    CHECK(f.load().steps == 123);
    const std::vector<std::string> unknown = unknown_starling_variables();
    CHECK(contains(unknown, "STARLING_TRAIN_STPES"));
    CHECK_FALSE(contains(unknown, "STARLING_TRAIN_STEPS"));
    CHECK_FALSE(contains(unknown, "STARLING_CONTROL"));
    CHECK_FALSE(contains(unknown, "STARLINGX_TRAIN_STEPS"));
}

TEST_CASE("[data].tokenizer is read, and the model's vocabulary must hold the tokenizer's") {
    // The fixture's vocabulary is GPT-2's size, 50257 tokens.
    const std::string fixture =
        std::string(STARLING_SOURCE_DIR) + "/tests/data/gpt2_style_tokenizer.json";
    const auto config = [&](int vocab, const std::string& tokenizer) {
        return "[model]\nvocab_size = " + std::to_string(vocab) + "\n[data]\ntokenizer = \"" +
               tokenizer + "\"\n";
    };
    const ConfigFile small(config(50256, fixture));
    CHECK_THROWS_WITH(small.load(),
                      Catch::Contains(small.path.string()) &&
                          Catch::Contains("[model].vocab_size 50256 is below the 50257 tokens of "
                                          "[data].tokenizer " +
                                          fixture));
    CHECK(ConfigFile(config(50257, fixture)).load().data.tokenizer == fixture);
    CHECK(ConfigFile(config(50304, fixture)).load().model.vocab_size ==
          50304);  // padded to a multiple of 64
    CHECK(ConfigFile(config(50257 + 63, fixture)).load().model.vocab_size == 50320);
    // More rows than padding adds: a model of another vocabulary, whose text the tokenizer would
    // garble.
    const ConfigFile large(config(50257 + 64, fixture));
    CHECK_THROWS_WITH(large.load(),
                      Catch::Contains("[model].vocab_size 50321 pads more than 63 rows past the "
                                      "50257 tokens of [data].tokenizer " +
                                      fixture));
    const ConfigFile missing(config(50304, "/nonexistent/tokenizer.json"));
    CHECK_THROWS_WITH(missing.load(),
                      Catch::Contains("[data].tokenizer: /nonexistent/tokenizer.json"));
    CHECK(ConfigFile("").load().data.tokenizer.empty());  // bytes
}

TEST_CASE("nano-bpe.toml's model holds the 4096-token KJV tokenizer its README makes") {
    const std::string configs = std::string(STARLING_SOURCE_DIR) + "/configs/";
    const int64_t nano_parameters = load_train_config(configs + "nano.toml").model.num_parameters();
    TempDir dir;
    const std::string tokenizer = dir.file("kjv-4096.json").string();
    put(tokenizer, train_bpe(read_kjv_text(), 4096).hf_json);
    const EnvVar where("STARLING_DATA_TOKENIZER", tokenizer.c_str());  // instead of out/tokenizers/
    const TrainConfig c = load_train_config(configs + "nano-bpe.toml");
    CHECK(c.model.vocab_size == 4096);
    CHECK(c.model.num_parameters() ==
          1377408);  // nano's plus 3840 more embedding rows of 128 (tied)
    CHECK(c.model.num_parameters() - nano_parameters == 3840 * 128);
    CHECK(c.data.dir == "out/kjv-bpe");
}

TEST_CASE("a file of every declared key at its shown default loads as the defaults") {
    // The tables of docs/config.md and --help are these descriptions: their defaults must be
    // what a file saying them gives.
    const std::vector<KeyDescription> defaults = train_config_keys();
    ConfigFile f(toml_of(defaults));
    check_same_values(train_config_keys(f.load()), defaults);
}

TEST_CASE("a file of every declared key at other values reads each into its own field") {
    TrainConfig changed;
    changed.model.n_layer = 3;
    changed.batch_size = 5;
    changed.seed = 77;
    changed.device = "cpu";
    changed.schedule.min_lr_fraction = 0.25f;
    changed.adamw.grad_clip = 2.5f;
    changed.data.partition_count = 4;
    changed.data.partition_index = 3;
    changed.log_every = 9;
    changed.eval_batches = 2;
    changed.run_dir = "elsewhere";
    changed.resume = false;
    const std::vector<KeyDescription> keys = train_config_keys(changed);
    ConfigFile f(toml_of(keys));
    check_same_values(train_config_keys(f.load()), keys);
}

TEST_CASE("a value outside its declared range is refused with the range") {
    CHECK_THROWS_WITH(ConfigFile("[train]\nbatch_size = 0\n").load(),
                      Catch::Contains("[train].batch_size must be at least 1, got 0"));
    CHECK_THROWS_WITH(ConfigFile("[optimizer]\nbeta2 = 1.0\n").load(),
                      Catch::Contains("[optimizer].beta2 must be in [0, 1), got 1"));
    CHECK_THROWS_WITH(ConfigFile("[checkpoint]\nevery = -1\n").load(),
                      Catch::Contains("[checkpoint].every must not be negative"));
    CHECK_THROWS_WITH(ConfigFile("[data]\ndir = \"\"\n").load(),
                      Catch::Contains("[data].dir must not be empty"));
}
