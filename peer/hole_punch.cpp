#include "peer/hole_punch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <optional>
#include <string_view>
#include <thread>

#include "common/errno_text.h"
#include "common/error.h"
#include "peer/address.h"
#include "peer/dial_back.h"

namespace starling {

namespace {

using Clock = std::chrono::steady_clock;

// Each connect is given this long before a fresh one: about the first SYN's retransmission, so
// an attempt that met the other side's NAT before that side's own SYN had gone out is retried.
constexpr std::chrono::milliseconds kAttempt{1000};
constexpr std::chrono::milliseconds kSlice{50};
constexpr std::string_view kGreetingMagic = "STRLHP1\n";
constexpr size_t kGreetingBytes = kGreetingMagic.size() + 2 * sizeof(uint64_t);

// numeric_only: a literal address, not a name to look up (a partner's endpoint).
sockaddr_in ipv4_address(const std::string& host_port, bool numeric_only) {
    const std::optional<HostPort> at = parse_host_port(host_port);
    if (!at || at->port == 0) throw Error(fmt::format("'{}' is not host:port", host_port));
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = numeric_only ? AI_NUMERICHOST : 0;
    addrinfo* found = nullptr;
    if (const int err = ::getaddrinfo(at->host.c_str(), nullptr, &hints, &found); err != 0)
        throw Error(
            fmt::format("cannot resolve {} to an IPv4 address (hole punching is IPv4 only): {}",
                        at->host, ::gai_strerror(err)));
    sockaddr_in address{};
    std::memcpy(&address, found->ai_addr, sizeof(address));
    ::freeaddrinfo(found);
    address.sin_port = htons(at->port);
    return address;
}

// A non-blocking IPv4 socket bound to `port`, which other sockets of this process may share.
UniqueFd reusable_socket(uint16_t port) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) throw Error("cannot open a socket: " + errno_text(errno));
    const int one = 1;
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_port = htons(port);
    local.sin_addr.s_addr = htonl(INADDR_ANY);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&local), sizeof(local)) != 0)
        throw Error(
            fmt::format("cannot bind port {} for hole punching: {}", port, errno_text(errno)));
    return fd;
}

int millis_until(Clock::time_point deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return static_cast<int>(std::clamp<int64_t>(left.count(), 0, kSlice.count()));
}

// Writes all of `bytes`, or false once `deadline` passes or the connection fails.
bool write_all(int fd, std::string_view bytes, Clock::time_point deadline) {
    while (!bytes.empty()) {
        const ssize_t sent = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (sent > 0) {
            bytes.remove_prefix(static_cast<size_t>(sent));
            continue;
        }
        if (sent < 0 && errno != EAGAIN && errno != EINTR) return false;
        if (Clock::now() >= deadline) return false;
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, millis_until(deadline));
    }
    return true;
}

// Reads up to `wanted` bytes, fewer when the far end closes or `deadline` passes first.
std::string read_some(int fd, size_t wanted, Clock::time_point deadline, bool to_end = false) {
    std::string got;
    std::array<char, 256> buffer{};
    while (got.size() < wanted) {
        const ssize_t n =
            ::recv(fd, buffer.data(), std::min(buffer.size(), wanted - got.size()), 0);
        if (n > 0) {
            got.append(buffer.data(), static_cast<size_t>(n));
            if (!to_end && got.find('\n') != std::string::npos) break;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EINTR)) break;
        if (Clock::now() >= deadline) break;
        pollfd p{fd, POLLIN, 0};
        ::poll(&p, 1, millis_until(deadline));
    }
    return got;
}

std::string greeting(uint64_t from, uint64_t to) {
    std::string bytes(kGreetingMagic);
    for (const uint64_t id : {from, to})
        for (int shift = 56; shift >= 0; shift -= 8)
            bytes.push_back(static_cast<char>(id >> shift));
    return bytes;
}

}  // namespace

std::string observe_answer(const asio::ip::tcp::endpoint& caller) {
    asio::ip::address address = caller.address();
    if (address.is_v6() && address.to_v6().is_v4_mapped())
        address = asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6());
    return HostPort{address.to_string(), caller.port()}.str() + "\n";
}

void PunchFailures::failed(uint64_t partner, Clock::time_point now) { failed_[partner] = now; }

bool PunchFailures::may_punch(uint64_t partner, Clock::time_point now) {
    const auto it = failed_.find(partner);
    if (it == failed_.end()) return true;
    if (now - it->second < kRetryAfter) return false;
    failed_.erase(it);
    return true;
}

PunchPort::PunchPort(uint16_t port) : reserved_(reusable_socket(port)) {
    sockaddr_in local{};
    socklen_t length = sizeof(local);
    ::getsockname(reserved_.get(), reinterpret_cast<sockaddr*>(&local), &length);
    port_ = ntohs(local.sin_port);
}

std::string PunchPort::observe(const std::string& anchor, std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    const sockaddr_in to = ipv4_address(anchor, false);
    UniqueFd fd = reusable_socket(port_);
    if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0 &&
        errno != EINPROGRESS)
        throw Error(fmt::format("cannot reach {} to observe port {}: {}", anchor, port_,
                                errno_text(errno)));
    pollfd p{fd.get(), POLLOUT, 0};
    while (::poll(&p, 1, millis_until(deadline)) == 0 && Clock::now() < deadline) {
    }
    int err = ETIMEDOUT;
    socklen_t length = sizeof(err);
    if (p.revents != 0) ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &length);
    if (err != 0)
        throw Error(
            fmt::format("cannot reach {} to observe port {}: {}", anchor, port_, errno_text(err)));
    std::string request(kObserveMagic);
    request.resize(kDialBackPreambleBytes, '\0');
    if (!write_all(fd.get(), request, deadline))
        throw Error(
            fmt::format("{} took no observe request within {} ms", anchor, timeout.count()));
    // Read to the far end's close, so that this side does not hold the connection's addresses in
    // TIME_WAIT and the next observe from this port to the same anchor can connect.
    std::string answer = read_some(fd.get(), 64, deadline, true);
    if (answer.empty() || answer.back() != '\n' ||
        !parse_host_port(answer.substr(0, answer.size() - 1)))
        throw Error(fmt::format("{} gave no address for port {} within {} ms", anchor, port_,
                                timeout.count()));
    answer.pop_back();
    return answer;
}

UniqueFd PunchPort::punch(const std::string& remote, uint64_t self_id, uint64_t partner_id,
                          Clock::time_point deadline, const std::atomic<bool>* cancelled) {
    const sockaddr_in to = ipv4_address(remote, true);
    const MutexLock lock(punching_);
    UniqueFd listener = reusable_socket(port_);
    if (::listen(listener.get(), 4) != 0)
        throw Error(fmt::format("cannot listen on port {} to punch: {}", port_, errno_text(errno)));
    const std::string mine = greeting(self_id, partner_id);
    const std::string theirs = greeting(partner_id, self_id);
    std::string last_problem = "no answer", connected_problem;
    int attempts = 0;
    const auto stopped = [&] { return Clock::now() >= deadline || (cancelled && *cancelled); };
    while (!stopped()) {
        attempts++;
        UniqueFd dialer = reusable_socket(port_);
        auto attempt_end = std::min(Clock::now() + kAttempt, deadline);
        if (::connect(dialer.get(), reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0 &&
            errno != EINPROGRESS) {
            // The partner's connect may have reached the listener already (then this one's
            // addresses are taken): the listener is still watched for a slice.
            last_problem = errno_text(errno);
            dialer.reset();
            attempt_end = std::min(Clock::now() + kSlice, deadline);
        }
        UniqueFd connection;
        while (!connection && Clock::now() < attempt_end && !(cancelled && *cancelled)) {
            std::array<pollfd, 2> waits{pollfd{listener.get(), POLLIN, 0},
                                        pollfd{dialer ? dialer.get() : -1, POLLOUT, 0}};
            ::poll(waits.data(), waits.size(), millis_until(attempt_end));
            if (waits[0].revents & POLLIN) {
                connection.reset(
                    ::accept4(listener.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
            } else if (waits[1].revents != 0) {
                int err = 0;
                socklen_t length = sizeof(err);
                ::getsockopt(dialer.get(), SOL_SOCKET, SO_ERROR, &err, &length);
                if (err != 0) {
                    last_problem = errno_text(err);
                    break;
                }
                connection.reset(dialer.release());
            }
        }
        if (!connection) {
            std::this_thread::sleep_for(kSlice);
            continue;
        }
        // Both greetings within a second of the connection, or it is not the partner's. A
        // connection that came but failed says more than the connects after it.
        const auto greeting_deadline = Clock::now() + std::chrono::seconds(1);
        if (!write_all(connection.get(), mine, greeting_deadline)) {
            connected_problem = "a connection failed before the greeting";
            continue;
        }
        const std::string heard =
            read_some(connection.get(), kGreetingBytes, greeting_deadline, true);
        if (heard != theirs) {
            connected_problem = heard.size() < kGreetingBytes
                                    ? "a connection came, but no greeting on it"
                                    : "a connection came, but its greeting was not the partner's";
            std::this_thread::sleep_for(kSlice);
            continue;
        }
        const int one = 1;
        ::setsockopt(connection.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        return connection;
    }
    const std::string why = cancelled && *cancelled ? "stopped"
                            : connected_problem.empty()
                                ? last_problem
                                : connected_problem + " (then: " + last_problem + ")";
    throw Error(fmt::format("no connection from port {} to {} in {} attempt(s): {}", port_, remote,
                            attempts, why));
}

}  // namespace starling
