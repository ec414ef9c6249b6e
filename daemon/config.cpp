#include "daemon/config.h"

#include "engine/config_reader.h"

namespace starling {

TrainConfig load_train_config(const std::string& path) {
    // starlingd's sections (daemon/swarm/node_config.h), not used here.
    return load_config_file<TrainConfig>(
        path, [](auto& v, TrainConfig& c) { visit_train_config(v, c); },
        {"node", "swarm", "outer", "exchange", "peer", "control", "metrics"});
}

std::vector<KeyDescription> train_config_keys(TrainConfig config) {
    KeyDescriber describe;
    visit_train_config(describe, config);
    return describe.keys;
}

}  // namespace starling
