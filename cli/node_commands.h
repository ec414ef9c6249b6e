// The commands that talk to a running starlingd through its Control API: status, peers, watch,
// join and leave. Each prints its result on stdout, errors on stderr, and returns the exit status
// (control_client.h: 0 done, 1 bad input or an error from the node, 2 no node at the address).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace starling::cli {

int run_status(const std::string& control, bool json);
int run_peers(const std::string& control, bool json);

struct WatchOptions {
    uint32_t interval_ms = 1000;  // 0: the node's default
    uint64_t count = 0;  // stop after this many updates; 0: until Ctrl-C or the node goes away
};
int run_watch(const std::string& control, const WatchOptions& options);

// Every seed is checked to be host:port before the node is asked.
int run_join(const std::string& control, const std::vector<std::string>& seeds);
int run_leave(const std::string& control);

}  // namespace starling::cli
