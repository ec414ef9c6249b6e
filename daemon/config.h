// `starling train`'s configuration: the engine's sections (engine/config.h) and the single-node
// trainer's own [log], [eval] and [checkpoint], with STARLING_* environment overrides on top.
#pragma once

#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/config_keys.h"

namespace starling {

// Reads and validates a TOML config. Unknown sections or keys are errors (a typo must not
// silently fall back to a default). Errors name the file and the key.
TrainConfig load_train_config(const std::string& path);
// Every key such a file holds, with its range, help and value in `config` (by default, the
// defaults) (engine/config_keys.h).
std::vector<KeyDescription> train_config_keys(TrainConfig config = {});

}  // namespace starling
