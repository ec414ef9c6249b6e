// TCP hole punching between two members that cannot be dialed (docs/nat.md, "Hole punching").
// Each keeps one local port for punching and learns from an anchor which public address and port
// its connections from that port come from: the anchor's peer port answers an observe request
// (peer/dial_back.h) with what it saw. Told each other's through their pairing, the two connect
// from their ports to each other's at once, again and again, until a connection carries both
// greetings (a TCP simultaneous open, or one side's connect meeting the other's listener). A NAT
// that keeps an outbound connection's port, or a firewall that lets replies in, lets the other
// side's SYN through once its own SYN has gone out; a NAT that draws a fresh port per connection
// does not, and such a pair stays on the relay.
#pragma once

#include <asio/ip/tcp.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "common/mutex.h"
#include "common/unique_fd.h"

namespace starling {

// The peer port's answer to an observe request: the caller's address and port as this side saw
// them, "host:port\n" (IPv4-mapped IPv6 addresses written as IPv4).
std::string observe_answer(const asio::ip::tcp::endpoint& caller);

// The partners a punch failed to, each left out of punching for a while after: the routers that
// defeat a punch (a NAT that draws a fresh port per connection) do so every time, and each try
// holds an exchange for up to [peer].punch_timeout_ms. Not thread-safe.
class PunchFailures {
public:
    static constexpr std::chrono::minutes kRetryAfter{10};
    void failed(uint64_t partner, std::chrono::steady_clock::time_point now);
    // Whether to punch to `partner` at `now`: no failure to it in the last kRetryAfter.
    bool may_punch(uint64_t partner, std::chrono::steady_clock::time_point now);

private:
    std::map<uint64_t, std::chrono::steady_clock::time_point> failed_;
};

class PunchPort {
public:
    // Reserves a local IPv4 port for punching (0: a free one); throws starling::Error.
    explicit PunchPort(uint16_t port = 0);
    uint16_t port() const { return port_; }

    // "host:port" that the peer port at `anchor` (host:port) sees a connection from this port
    // come from. Throws starling::Error naming the problem. Runs beside a punch (another
    // connection from the same port).
    std::string observe(const std::string& anchor, std::chrono::milliseconds timeout);

    // A connection from this port to `remote` (host:port, as an anchor observed the partner's
    // punch port) on which both greetings passed: each side's node id, then the other's. Throws
    // starling::Error with the last reason when none connects by `deadline`, or once `cancelled`
    // is set. Punches through this port take turns.
    UniqueFd punch(const std::string& remote, uint64_t self_id, uint64_t partner_id,
                   std::chrono::steady_clock::time_point deadline,
                   const std::atomic<bool>* cancelled = nullptr);

private:
    UniqueFd reserved_;  // bound, never listening: holds the port for this node
    uint16_t port_ = 0;
    Mutex punching_;
};

}  // namespace starling
