#include "daemon/config.h"

#include "engine/config_reader.h"

namespace starling {

TrainConfig load_train_config(const std::string& path) {
    // starlingd's sections (daemon/swarm/node_config.h), not used here.
    ConfigFileReader reader(path,
                            {"node", "swarm", "outer", "exchange", "peer", "control", "metrics"});
    TrainConfig c;
    visit_train_config(reader, c);
    reader.finish();
    try {
        c.validate();
    } catch (const Error& err) {
        throw Error(path + ": " + err.what());
    }
    return c;
}

std::vector<KeyDescription> train_config_keys(TrainConfig config) {
    KeyDescriber describe;
    visit_train_config(describe, config);
    return describe.keys;
}

}  // namespace starling
