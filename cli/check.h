// `starling check`: the preflight an operator runs before starting starlingd with a config. It
// loads the config exactly as the daemon does, then checks what the daemon would trip over only
// once it is running: the device, the data, the node's directory and its free space, the ports,
// the announce address, the seeds and the swarm credentials.
#pragma once

#include <string>
#include <vector>

#include "daemon/swarm/node_config.h"

namespace starling::cli {

enum class CheckLevel { Ok, Warn, Fail };

struct CheckResult {
    CheckLevel level = CheckLevel::Ok;
    std::string name;    // "device", "data", ...
    std::string detail;  // what was found
    std::string fix;     // for Warn and Fail: what to do about it
};

// "ok    data: ..." and, for warn and FAIL, a second line "      fix: ...".
std::string format_check(const CheckResult& result);

CheckResult check_device(const NodeConfig& config);
CheckResult check_data(const NodeConfig& config);
// [data].tokenizer (bytes when empty), and that the shards of [data].dir were made with it.
CheckResult check_tokenizer(const NodeConfig& config);
CheckResult check_data_dir(const NodeConfig& config);
CheckResult check_credentials(const NodeConfig& config);

struct CheckOptions {
    std::string config_path;
    NodeFlags flags;  // starlingd's flags, applied over the file as the daemon would
};

// Prints every check as it completes; 0 when none failed, 1 otherwise (a config that does not
// load is one failed check).
int run_check(const CheckOptions& options);

}  // namespace starling::cli
