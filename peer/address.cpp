#include "peer/address.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <charconv>
#include <fmt/format.h>

#include "common/error.h"

namespace starling {

std::string HostPort::str() const {
    return host.find(':') != std::string::npos ? fmt::format("[{}]:{}", host, port)
                                               : fmt::format("{}:{}", host, port);
}

std::optional<HostPort> parse_host_port(std::string_view text) {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size())
        return std::nullopt;
    std::string_view host = text.substr(0, colon);
    const std::string_view port_text = text.substr(colon + 1);
    if (host.front() == '[') {
        if (host.size() < 3 || host.back() != ']') return std::nullopt;
        host = host.substr(1, host.size() - 2);
    } else if (host.find(':') != std::string_view::npos) {
        return std::nullopt;  // a bare IPv6 address needs brackets
    }
    // Brackets only enclose a whole host: one left inside would print back as another address.
    if (host.find_first_of("[]") != std::string_view::npos) return std::nullopt;
    unsigned port = 0;
    const auto [end, ec] =
        std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
    if (ec != std::errc() || end != port_text.data() + port_text.size() || port > 65535)
        return std::nullopt;
    return HostPort{std::string(host), static_cast<uint16_t>(port)};
}

bool is_loopback_host(std::string_view host) {
    if (host == "localhost" || host == "::1") return true;
    in_addr v4{};
    const std::string h(host);
    return inet_pton(AF_INET, h.c_str(), &v4) == 1 && (ntohl(v4.s_addr) >> 24) == 127;
}

std::vector<std::string> resolve_seed_targets(const std::string& seed) {
    const auto at = parse_host_port(seed);
    if (!at) return {};
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(at->host.c_str(), std::to_string(at->port).c_str(), &hints, &found) != 0)
        return {};
    std::vector<std::string> targets;
    for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
        char host[INET6_ADDRSTRLEN] = {};
        const bool v6 = a->ai_family == AF_INET6;
        const void* raw = v6 ? static_cast<const void*>(
                                   &reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr)
                             : static_cast<const void*>(
                                   &reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr);
        if ((a->ai_family != AF_INET && !v6) ||
            inet_ntop(a->ai_family, raw, host, sizeof host) == nullptr)
            continue;
        std::string target = v6 ? fmt::format("ipv6:[{}]:{}", host, at->port)
                                : fmt::format("ipv4:{}:{}", host, at->port);
        if (std::find(targets.begin(), targets.end(), target) == targets.end())
            targets.push_back(std::move(target));
    }
    freeaddrinfo(found);
    return targets;
}

bool is_wildcard_host(std::string_view host) {
    return host == "0.0.0.0" || host == "::" || host.empty();
}

std::string choose_announce_address(std::string_view listen, std::string_view announce,
                                    uint16_t bound_port, const std::vector<std::string>& seeds) {
    const auto listen_at = parse_host_port(listen);
    if (!listen_at) throw Error(fmt::format("peer.listen '{}' is not host:port", listen));
    HostPort chosen;
    if (!announce.empty()) {
        const auto parsed = parse_host_port(announce);
        if (!parsed || parsed->port == 0 || is_wildcard_host(parsed->host))
            throw Error(
                fmt::format("peer.announce '{}' is not a host:port that peers can dial", announce));
        chosen = *parsed;
    } else {
        if (is_wildcard_host(listen_at->host))
            throw Error(
                fmt::format("peer.listen '{}' listens on every interface: set peer.announce to the "
                            "host:port other nodes should dial",
                            listen));
        chosen = HostPort{listen_at->host, bound_port};
    }
    if (is_loopback_host(listen_at->host) && !is_loopback_host(chosen.host))
        throw Error(fmt::format(
            "peer.listen '{}' accepts only local connections but peer.announce is '{}': "
            "listen on 0.0.0.0 or on that address",
            listen, chosen.str()));
    if (is_loopback_host(chosen.host)) {
        for (const auto& seed : seeds) {
            const auto at = parse_host_port(seed);
            if (at && !is_loopback_host(at->host))
                throw Error(fmt::format(
                    "this node would announce the loopback address {} but seed {} is on "
                    "another machine, which could never reach it: set peer.announce to "
                    "an address peers can reach",
                    chosen.str(), seed));
        }
    }
    return chosen.str();
}

}  // namespace starling
