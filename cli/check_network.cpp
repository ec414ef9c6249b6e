#include "cli/check_network.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <memory>
#include <optional>

#include "common/errno_text.h"
#include "common/error.h"
#include "daemon/swarm/swarm_node.h"
#include "peer/address.h"
#include "model/config.h"
#include "model/manifest.h"
#include "peer/connection_gate.h"
#include "peer/peer_node.h"
#include "peer/reachability_watch.h"

namespace starling::cli {

namespace {

struct AddrInfoFree {
    void operator()(addrinfo* list) const { freeaddrinfo(list); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoFree>;

// Closes the descriptor when the check is done with it, on every path.
class Socket {
public:
    explicit Socket(int fd) : fd_(fd) {}
    ~Socket() {
        if (fd_ >= 0) ::close(fd_);
    }
    Socket(const Socket&) = delete;
    Socket& operator=(const Socket&) = delete;
    int fd() const { return fd_; }

private:
    int fd_;
};

// Resolves host:port for a TCP socket; throws Error naming the host when it cannot.
AddrInfoList resolve(const std::string& host, uint16_t port, int flags) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = flags | AI_NUMERICSERV;
    addrinfo* list = nullptr;
    const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &list);
    if (rc != 0) throw Error(fmt::format("cannot resolve {}: {}", host, gai_strerror(rc)));
    return AddrInfoList(list);
}

// "" when one address of the list accepts a connection before the deadline.
std::string connect_one(const addrinfo& address, std::chrono::steady_clock::time_point deadline) {
    const Socket socket(
        ::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (socket.fd() < 0) return errno_text(errno);
    if (::connect(socket.fd(), address.ai_addr, address.ai_addrlen) == 0) return "";
    if (errno != EINPROGRESS) return errno_text(errno);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd wait{socket.fd(), POLLOUT, 0};
    const int ready = ::poll(&wait, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (ready < 0) return errno_text(errno);
    if (ready == 0) return "no answer";
    int error = 0;
    socklen_t size = sizeof(error);
    if (::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &size) != 0)
        return errno_text(errno);
    return error == 0 ? "" : errno_text(error);
}

struct Listener {
    std::string role;  // "peer", "control", "metrics"
    std::string key;   // the config key and flag that set it
    std::string text;  // as configured
};

// The addresses the node binds; the control API on a unix socket has no port to check.
std::vector<Listener> listeners(const NodeConfig& config) {
    std::vector<Listener> out{{"peer", "[peer].listen (--listen)", config.swarm.peer.listen}};
    if (config.control_listen.rfind("unix:", 0) != 0)
        out.push_back({"control", "[control].listen (--control)", config.control_listen});
    if (!config.metrics_listen.empty())
        out.push_back({"metrics", "[metrics].listen (--metrics)", config.metrics_listen});
    return out;
}

// Two listeners on one port collide when either takes every interface or both take the same host.
bool collide(const HostPort& a, const HostPort& b) {
    if (a.port == 0 || a.port != b.port) return false;
    return a.host == b.host || is_wildcard_host(a.host) || is_wildcard_host(b.host);
}

}  // namespace

std::string connect_problem(const std::string& host, uint16_t port,
                            std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    AddrInfoList list;
    try {
        list = resolve(host, port, 0);
    } catch (const Error& e) {
        return e.what();
    }
    std::string problem = "no address";
    for (const addrinfo* at = list.get(); at != nullptr; at = at->ai_next) {
        problem = connect_one(*at, deadline);
        if (problem.empty()) return "";
    }
    return problem == "no answer" ? fmt::format("no answer within {} ms", timeout.count())
                                  : problem;
}

std::string bind_problem(const std::string& host, uint16_t port) {
    AddrInfoList list;
    try {
        list = resolve(host, port, AI_PASSIVE);
    } catch (const Error& e) {
        return e.what();
    }
    std::string problem = "no address";
    bool bound = false;
    for (const addrinfo* at = list.get(); at != nullptr; at = at->ai_next) {
        const Socket socket(::socket(at->ai_family, at->ai_socktype | SOCK_CLOEXEC, 0));
        if (socket.fd() < 0) {
            problem = errno_text(errno);
            continue;
        }
        // As gRPC's servers do, so a port whose old connections linger in TIME_WAIT counts as free.
        const int on = 1;
        ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
        if (::bind(socket.fd(), at->ai_addr, at->ai_addrlen) == 0) {
            bound = true;
        } else if (errno == EADDRINUSE) {
            return "in use";
        } else {
            problem = errno_text(errno);  // e.g. ::1 on a host without IPv6: fine if another binds
        }
    }
    return bound ? "" : problem;
}

std::vector<CheckResult> check_ports(const NodeConfig& config) {
    std::vector<CheckResult> results;
    std::vector<std::pair<Listener, HostPort>> parsed;
    for (const Listener& listener : listeners(config)) {
        const auto at = parse_host_port(listener.text);
        if (!at) {
            results.push_back(
                {CheckLevel::Fail, "ports",
                 fmt::format("{} address '{}' is not host:port", listener.role, listener.text),
                 "set " + listener.key + " to host:port"});
            continue;
        }
        std::optional<std::string> clash;
        for (const auto& [other, other_at] : parsed)
            if (collide(*at, other_at)) clash = other.role + " " + other.text;
        parsed.emplace_back(listener, *at);
        if (clash) {
            results.push_back(
                {CheckLevel::Fail, "ports",
                 fmt::format("{} {} takes the port of {}", listener.role, listener.text, *clash),
                 "give " + listener.key + " a port of its own"});
            continue;
        }
        const std::string problem = bind_problem(at->host, at->port);
        if (problem.empty()) {
            results.push_back({CheckLevel::Ok, "ports",
                               fmt::format("{} {} is free", listener.role, listener.text), ""});
        } else if (problem == "in use") {
            results.push_back({CheckLevel::Fail, "ports",
                               fmt::format("{} {} is in use", listener.role, listener.text),
                               "another starlingd running? stop it, or change " + listener.key});
        } else {
            results.push_back(
                {CheckLevel::Fail, "ports",
                 fmt::format("{} {} cannot be bound: {}", listener.role, listener.text, problem),
                 "set " + listener.key + " to an address of this machine"});
        }
    }
    return results;
}

CheckResult check_announce(const NodeConfig& config) {
    const PeerConfig& peer = config.swarm.peer;
    const auto listen = parse_host_port(peer.listen);
    // Port 0 asks for any free port, known only once the node binds; a stand-in serves for the
    // rule.
    constexpr uint16_t kStandInPort = 7700;
    const uint16_t port = listen && listen->port != 0 ? listen->port : kStandInPort;
    const bool port_at_start = listen && listen->port == 0 && peer.announce.empty();
    try {
        const std::string address =
            choose_announce_address(peer.listen, peer.announce, port, peer.seeds);
        const std::string shown =
            port_at_start ? listen->host + " on the port it gets at start" : address;
        return {CheckLevel::Ok, "announce", "peers will dial " + shown, ""};
    } catch (const Error& e) {
        return {
            CheckLevel::Fail, "announce", e.what(),
            "set [peer].announce (or --announce) to the host:port other nodes can dial, and [peer].listen to "
            "an address that accepts them"};
    }
}

CheckResult check_seeds(const NodeConfig& config) {
    const std::vector<std::string>& seeds = config.swarm.peer.seeds;
    if (seeds.empty()) return {CheckLevel::Ok, "seeds", "none: the node starts a new swarm", ""};
    std::vector<std::string> malformed, unreachable, refused, incompatible;
    // This node as its peers would see it, for the comparison with each seed.
    Member self;
    self.fingerprint = ParameterManifest(config.swarm.train.model).fingerprint();
    self.model = model_signature(config.swarm.train.model);
    self.method = swarm_method(config.swarm);
    self.swarm_id = config.swarm.peer.swarm_id;
    self.protocol_version = kProtocolVersion;
    for (const std::string& seed : seeds) {
        const auto at = parse_host_port(seed);
        if (!at || at->port == 0) {
            malformed.push_back("'" + seed + "'");
        } else if (const std::string problem =
                       connect_problem(at->host, at->port, kSeedConnectTimeout);
                   !problem.empty()) {
            unreachable.push_back(fmt::format("{} ({})", seed, problem));
        } else {
            // Reachable: does it take this config's secret? A wrong one would leave the node alone.
            SeedAnswer answer;
            try {
                answer = ask_seed(config.swarm.peer, seed, std::chrono::milliseconds(3000));
            } catch (const Error& e) {
                answer.problem = e.what();
            }
            const std::string& why = answer.problem;
            if (answer.member) {
                if (const std::string differs = incompatibility(*answer.member, self);
                    !differs.empty())
                    incompatible.push_back(fmt::format("{} {}", seed, differs));
            } else if (why.find("peer auth") != std::string::npos) {
                refused.push_back(fmt::format("{} ({})", seed, why));
            } else {
                unreachable.push_back(fmt::format("{} ({})", seed, why));
            }
        }
    }
    if (!incompatible.empty())
        return {
            CheckLevel::Fail, "seeds",
            fmt::format("{} of {} can never pair with this node: {}", incompatible.size(),
                        seeds.size(), fmt::join(incompatible, "; ")),
            "use the swarm's config for [model] and [peer].swarm_id (every node of a swarm trains the same model)"};
    if (!refused.empty())
        return {
            CheckLevel::Fail, "seeds",
            fmt::format("{} of {} refused this node's credentials: {}", refused.size(),
                        seeds.size(), fmt::join(refused, ", ")),
            "use the swarm's [peer].secret (or its CA and certificates): with these the node would train alone"};
    const std::string unreachable_text = fmt::format("{} of {} unreachable: {}", unreachable.size(),
                                                     seeds.size(), fmt::join(unreachable, ", "));
    if (!malformed.empty())
        return {CheckLevel::Fail, "seeds",
                fmt::format("not host:port: {}{}", fmt::join(malformed, ", "),
                            unreachable.empty() ? "" : "; " + unreachable_text),
                "write each of [peer].seeds (or --seed) as host:port"};
    if (!unreachable.empty())
        return {
            CheckLevel::Warn, "seeds", unreachable_text,
            "check the addresses and firewalls; the node starts anyway and keeps retrying its seeds"};
    return {CheckLevel::Ok, "seeds",
            fmt::format("{} reachable: {}", seeds.size(), fmt::join(seeds, ", ")), ""};
}

CheckResult check_reachable(const NodeConfig& config) {
    const PeerConfig& peer = config.swarm.peer;
    if (peer.seeds.empty())
        return {CheckLevel::Ok, "reachable",
                "no seed to dial this node back: it asks its first members once it runs", ""};
    std::unique_ptr<ConnectionGate> gate;
    DialBackInbox inbox;
    std::string address;
    try {
        gate = std::make_unique<ConnectionGate>(peer.listen, ConnectionLimits{});
        address = choose_announce_address(peer.listen, peer.announce, gate->port(), peer.seeds);
    } catch (const Error& e) {
        return {CheckLevel::Warn, "reachable", std::string("not checked: ") + e.what(),
                "see the ports and announce checks"};
    }
    gate->start(nullptr, {}, &inbox);
    std::vector<std::string> unanswered;
    for (const std::string& seed : peer.seeds) {
        DialBackResult result;
        try {
            result = ask_seed_to_dial_back(peer, seed, address, inbox);
        } catch (const Error& e) {
            result.error = e.what();
        }
        if (!result.answered) {
            unanswered.push_back(fmt::format("{} ({})", seed, result.error));
            continue;
        }
        if (result.arrived)
            return {CheckLevel::Ok, "reachable",
                    fmt::format("seed {} dialed {} and reached this machine", seed, address), ""};
        const std::string seen = result.observed.empty()
                                     ? ""
                                     : fmt::format("; it sees this machine as {}", result.observed);
        const std::string what =
            result.error.empty()
                ? fmt::format(
                      "seed {} connected to {}, but another process or machine answers there{}",
                      seed, address, seen)
                : fmt::format("seed {} could not dial {}: {}{}", seed, address, result.error, seen);
        ReachabilityVerdict verdict;
        if (!result.observed.empty()) verdict.observed.insert(result.observed);
        verdict.another_answers = result.error.empty();
        return {CheckLevel::Warn, "reachable", what, reachability_advice(address, verdict)};
    }
    return {CheckLevel::Warn, "reachable",
            fmt::format("no seed answered a dial-back request: {}", fmt::join(unanswered, ", ")),
            "see the seeds check; the node asks its members again once it runs"};
}

}  // namespace starling::cli
