// host:port strings as peers announce and dial them, and the checks that keep a node from
// announcing an address its peers cannot reach.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace starling {

struct HostPort {
    std::string host;  // without brackets for IPv6
    uint16_t port = 0;
    std::string str() const;  // brackets IPv6 hosts again
};

// "host:port" or "[v6]:port"; nullopt when malformed (no port, port out of range, empty host, a
// bracket anywhere but around the whole host).
std::optional<HostPort> parse_host_port(std::string_view text);

bool is_loopback_host(std::string_view host);  // localhost, 127.0.0.0/8, ::1
bool is_wildcard_host(std::string_view host);  // 0.0.0.0, ::

// Every address a seed's host resolves to, as gRPC targets ("ipv4:10.1.2.3:7700",
// "ipv6:[fd00::1]:7700"), in the resolver's order and without repeats; empty when it does not
// resolve (or is malformed). A name with several addresses, such as a Kubernetes headless service
// over a StatefulSet's pods, stands for several members, this node possibly among them.
std::vector<std::string> resolve_seed_targets(const std::string& seed);

// The address this node announces: `announce` when set, else the listen host with the port the
// server got. Throws starling::Error with advice when the result cannot work: a wildcard with no
// announce, a loopback announcement in a swarm whose seeds are not all loopback, or a loopback
// listen address announced as a routable one.
std::string choose_announce_address(std::string_view listen, std::string_view announce,
                                    uint16_t bound_port, const std::vector<std::string>& seeds);

}  // namespace starling
