// Fuzz target for host:port parsing, which reads the addresses peers announce and that a node
// dials. scripts/fuzz builds this file into a libFuzzer binary; the peer suite compiles it too and
// replays tests/peer/host-port-corpus through fuzz_host_port_valid.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "peer/address.h"

// Parses one input; true when it was an address. What parses must print back (HostPort::str) to
// text that parses to the same host and port: anything else is a bug.
bool fuzz_host_port_valid(const uint8_t* data, size_t size) {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const auto parsed = starling::parse_host_port(text);
    if (!parsed) return false;
    const auto again = starling::parse_host_port(parsed->str());
    if (!again || again->host != parsed->host || again->port != parsed->port) __builtin_trap();
    return true;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_host_port_valid(data, size);
    return 0;
}
