#include "daemon/config.h"

#include "engine/config_reader.h"

namespace starling {

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
