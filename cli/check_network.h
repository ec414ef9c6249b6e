// The network half of `starling check`: can the node bind its addresses, will its peers be able
// to dial the address it announces, and do its seeds answer.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "cli/check.h"

namespace starling::cli {

// One result per address the node listens on: the peer port, the control port (not a unix
// socket) and the metrics port (when on). Fails when an address is in use, is not this machine's
// or is shared by two of them.
std::vector<CheckResult> check_ports(const NodeConfig& config);

// The address the node would announce, by the peer layer's own rule (peer/address.h).
CheckResult check_announce(const NodeConfig& config);

// A TCP connect to every seed; an unreachable seed is a warning, since the node starts anyway
// and keeps retrying.
CheckResult check_seeds(const NodeConfig& config);

// A seed dials back the address the node would announce, to a listener on its peer address:
// whether members will be able to reach the node, or only it them (behind NAT or a firewall).
CheckResult check_reachable(const NodeConfig& config);

inline constexpr std::chrono::milliseconds kSeedConnectTimeout{2000};

// "" when a TCP connection to host:port opens within the timeout, else why not.
std::string connect_problem(const std::string& host, uint16_t port,
                            std::chrono::milliseconds timeout);
// "" when a listening socket could bind host:port now, else why not ("in use", ...).
std::string bind_problem(const std::string& host, uint16_t port);

}  // namespace starling::cli
