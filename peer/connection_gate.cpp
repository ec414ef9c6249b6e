#include "peer/connection_gate.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <utility>

#include "peer/address.h"
#include "peer/hole_punch.h"
#include "peer/listen_address.h"
#include "peer/tcp_received.h"
#include "common/errno_text.h"
#include "common/error.h"

namespace starling {
namespace {

// How often the gate looks for connections out of time or closed; the cut comes this late at most.
constexpr auto kSweepPeriod = std::chrono::milliseconds(250);
// After accept() failed for want of descriptors or memory: the listener stays readable, so
// waiting on it again at once would spin.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

asio::ip::address without_v4_mapping(const asio::ip::address& address) {
    if (address.is_v6() && address.to_v6().is_v4_mapped())
        return asio::ip::make_address_v4(asio::ip::v4_mapped, address.to_v6());
    return address;
}

std::string connection_key(const asio::ip::address& address, uint16_t port) {
    return without_v4_mapping(address).to_string() + " " + std::to_string(port);
}

int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// gRPC writes peers as URIs: "[" and "]" around an IPv6 address come as %5B and %5D.
std::string percent_decoded(std::string_view text) {
    std::string out;
    for (size_t i = 0; i < text.size(); i++) {
        if (text[i] == '%' && i + 2 < text.size() && hex_digit(text[i + 1]) >= 0 &&
            hex_digit(text[i + 2]) >= 0) {
            out.push_back(static_cast<char>(hex_digit(text[i + 1]) * 16 + hex_digit(text[i + 2])));
            i += 2;
        } else {
            out.push_back(text[i]);
        }
    }
    return out;
}

enum class Standing { Open, ClosedHere, ClosedThere };

// Who ended a connection that has left ESTABLISHED: this side (gRPC shut it down, its handshake
// timeout or a protocol error) when this side's FIN went first, else the far end.
Standing standing(int fd) {
    tcp_info info{};
    socklen_t length = sizeof(info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return Standing::ClosedThere;
    switch (info.tcpi_state) {
        case TCP_ESTABLISHED: return Standing::Open;
        case TCP_FIN_WAIT1:
        case TCP_FIN_WAIT2:
        case TCP_CLOSING: return Standing::ClosedHere;
        default: return Standing::ClosedThere;
    }
}

}  // namespace

struct ConnectionGate::Arriving {
    Arriving(asio::io_context& io, int accepted, int duplicate, std::string connection,
             asio::ip::tcp::endpoint from)
        : fd(accepted),
          waiter(io, duplicate),
          key(std::move(connection)),
          remote(std::move(from)) {}
    ~Arriving() {
        if (fd >= 0) ::close(fd);
    }
    Arriving(const Arriving&) = delete;
    Arriving& operator=(const Arriving&) = delete;

    int fd;                                 // -1 once gRPC has it
    asio::posix::stream_descriptor waiter;  // a duplicate of fd, to wait on
    std::string key;
    asio::ip::tcp::endpoint remote;
    std::vector<std::uint8_t> preamble;  // bytes of a dial-back preamble read so far
};

std::optional<std::string> connection_key_of_grpc_peer(std::string_view peer) {
    const size_t colon = peer.find(':');
    if (colon == std::string_view::npos) return std::nullopt;
    const std::string_view scheme = peer.substr(0, colon);
    if (scheme != "ipv4" && scheme != "ipv6") return std::nullopt;
    const auto host_port = parse_host_port(percent_decoded(peer.substr(colon + 1)));
    if (!host_port) return std::nullopt;
    asio::error_code error;
    const asio::ip::address address = asio::ip::make_address(host_port->host, error);
    if (error) return std::nullopt;
    return connection_key(address, host_port->port);
}

ConnectionGate::ConnectionGate(const std::string& listen, ConnectionLimits limits)
    : limits_(limits), listener_(io_), backoff_(io_), sweeper_(io_) {
    listen_on(listener_, listen, "[peer].listen", "listen");
    listener_.non_blocking(true);
    port_ = listener_.local_endpoint().port();
}

ConnectionGate::~ConnectionGate() { stop(); }

void ConnectionGate::start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor,
                           std::function<bool(const std::string& address)> member_host,
                           DialBackInbox* inbox) {
    acceptor_ = std::move(acceptor);
    member_host_ = std::move(member_host);
    inbox_ = inbox;
    wait_for_connections();
    sweep();
    thread_ = std::thread([this] { io_.run(); });
}

void ConnectionGate::stop() {
    io_.stop();
    if (thread_.joinable()) thread_.join();
    asio::error_code ignored;
    listener_.close(ignored);
    MutexLock lock(mutex_);
    for (const auto& [key, watched] : watched_) ::close(watched.duplicate);
    watched_.clear();
    watching_ = 0;
}

void ConnectionGate::wait_for_connections() {
    listener_.async_wait(asio::socket_base::wait_read, [this](const asio::error_code& error) {
        if (!error) accept_ready();
    });
}

void ConnectionGate::accept_ready() {
    for (;;) {
        sockaddr_storage from{};
        socklen_t length = sizeof(from);
        const int fd = ::accept4(listener_.native_handle(), reinterpret_cast<sockaddr*>(&from),
                                 &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            asio::ip::tcp::endpoint remote;
            std::memcpy(remote.data(), &from, std::min<size_t>(length, remote.capacity()));
            remote.resize(std::min<size_t>(length, remote.capacity()));
            admit(fd, remote);
            continue;
        }
        const int failure = errno;
        if (failure == EINTR || failure == ECONNABORTED) continue;
        if (failure == EAGAIN || failure == EWOULDBLOCK) break;
        // EMFILE and kin: the connections wait in the listen queue until descriptors free up.
        if (accept_warning_.due())
            spdlog::warn("peer: cannot accept a connection: {}; trying again", errno_text(failure));
        backoff_.expires_after(kAcceptBackoff);
        backoff_.async_wait([this](const asio::error_code& error) {
            if (!error) wait_for_connections();
        });
        return;
    }
    wait_for_connections();
}

void ConnectionGate::admit(int fd, const asio::ip::tcp::endpoint& remote) {
    const std::string source = without_v4_mapping(remote.address()).to_string();
    std::string key;
    {
        MutexLock lock(mutex_);
        const auto held = [&](auto&& which) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
            return static_cast<size_t>(
                std::count_if(watched_.begin(), watched_.end(),
                              [&](const auto& entry) { return which(entry.second); }));
        };
        const size_t from_source = held([&](const Watched& w) { return w.source == source; });
        const char* refused = nullptr;
        bool member_host = false;
        if (from_source >= limits_.max_unauthenticated_per_source) {
            refused =
                "the cap on unauthenticated connections from one address "
                "([peer].max_unauthenticated_per_source)";
        } else if (held([](const Watched& w) { return !w.member_host; }) >=
                   limits_.max_unauthenticated) {
            member_host = member_host_ && member_host_(source);
            if (member_host && held([](const Watched& w) { return w.member_host; }) >=
                                   limits_.reserved_for_members)
                refused = "the places reserved for members' addresses, all taken";
            else if (!member_host && !made_room_for(from_source))
                refused =
                    "the cap on unauthenticated connections "
                    "([peer].max_unauthenticated_connections)";
        }
        const int duplicate = refused ? -1 : ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (!refused && duplicate < 0) refused = "no descriptor left to watch it with";
        if (refused) {
            // Counted first: whoever sees the connection end may read the count at once.
            note_closed(refused, source);
            ::close(fd);
            return;
        }
        key = connection_key(remote.address(), remote.port());
        // The same far end again: the earlier connection has gone, or it could not be accepted.
        if (const auto earlier = watched_.find(key); earlier != watched_.end())
            ::close(earlier->second.duplicate);
        watched_[key] = {duplicate, source,
                         std::chrono::steady_clock::now() + limits_.authenticate_within,
                         member_host};
        watching_ = watched_.size();
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    const int waiter = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (waiter < 0) {
        // No descriptor to wait with: closed, as one over the caps is (the duplicate is cut).
        ::close(fd);
        forget(key);
        return;
    }
    wait_for_first_bytes(std::make_shared<Arriving>(io_, fd, waiter, key, remote));
}

void ConnectionGate::adopt(UniqueFd fd) {
    sockaddr_storage address{};
    socklen_t length = sizeof(address);
    if (::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) return;
    asio::ip::tcp::endpoint remote;
    std::memcpy(remote.data(), &address, std::min<size_t>(length, remote.capacity()));
    remote.resize(length);
    // Held by the handler, so a gate stopped before it runs still closes the socket.
    asio::post(io_, [this, held = std::make_shared<UniqueFd>(std::move(fd)), remote] {
        admit(held->release(), remote);
    });
}

void ConnectionGate::wait_for_first_bytes(std::shared_ptr<Arriving> arriving) {
    Arriving& waiting = *arriving;
    waiting.waiter.async_wait(
        asio::posix::stream_descriptor::wait_read,
        [this, arriving = std::move(arriving)](const asio::error_code& error) {
            if (error) return;  // the gate is stopping
            read_first_bytes(arriving);
        });
}

void ConnectionGate::read_first_bytes(std::shared_ptr<Arriving> arriving) {
    std::array<std::uint8_t, kDialBackPreambleBytes> first{};
    Arriving& a = *arriving;
    // Bytes that may be gRPC's are only peeked at; once they are a dial-back's, they are read.
    const size_t wanted = kDialBackPreambleBytes - a.preamble.size();
    const ssize_t got = ::recv(a.fd, first.data(), wanted, a.preamble.empty() ? MSG_PEEK : 0);
    if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        wait_for_first_bytes(std::move(arriving));
        return;
    }
    if (got <= 0) {  // closed before it said anything, or cut by the sweep
        forget(a.key);
        return;
    }
    if (a.preamble.empty()) {
        const Preamble kind = classify_preamble({first.data(), static_cast<size_t>(got)});
        if (kind == Preamble::Other) {
            if (!acceptor_) {
                forget(a.key);
                return;
            }
            grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
            connection.listener_fd = listener_.native_handle();
            connection.fd = std::exchange(a.fd, -1);
            acceptor_->HandleNewConnection(&connection);
            return;
        }
        // The magic so far: take the bytes out of the socket, so the wait does not spin on them.
        const ssize_t taken = ::recv(a.fd, first.data(), static_cast<size_t>(got), 0);
        if (taken <= 0) {
            forget(a.key);
            return;
        }
        a.preamble.assign(first.begin(), first.begin() + taken);
    } else {
        a.preamble.insert(a.preamble.end(), first.begin(), first.begin() + got);
    }
    switch (classify_preamble(a.preamble)) {
        case Preamble::Incomplete: wait_for_first_bytes(std::move(arriving)); return;
        case Preamble::DialBack:
            if (inbox_) inbox_->arrived(nonce_of_preamble(a.preamble));
            break;
        case Preamble::Observe: {
            // A few bytes into an empty send buffer: the write does not block.
            const std::string answer = observe_answer(a.remote);
            (void)!::send(a.fd, answer.data(), answer.size(), MSG_NOSIGNAL);
            break;
        }
        case Preamble::Other: break;  // the magic, then something else: nobody's
    }
    forget(a.key);
}

void ConnectionGate::forget(const std::string& key) {
    MutexLock lock(mutex_);
    const auto it = watched_.find(key);
    if (it == watched_.end()) return;
    ::close(it->second.duplicate);
    watched_.erase(it);
    watching_ = watched_.size();
}

void ConnectionGate::sweep() {
    {
        MutexLock lock(mutex_);
        const auto now = std::chrono::steady_clock::now();
        // Out of time matters only while places are in demand: 64 daemons on two cores took
        // longer than 10 s over TLS now and then, and the gate cut 359 members' connections that
        // would have authenticated, with nobody waiting for their places.
        std::unordered_map<std::string, size_t> per_source;
        size_t strangers = 0, members = 0;
        for (const auto& [key, watched] : watched_) {
            per_source[watched.source]++;
            (watched.member_host ? members : strangers)++;
        }
        const auto in_demand = [&](const Watched& w) {
            const bool places_wanted = w.member_host ? 2 * members >= limits_.reserved_for_members
                                                     : 2 * strangers >= limits_.max_unauthenticated;
            return places_wanted ||
                   2 * per_source[w.source] >= limits_.max_unauthenticated_per_source;
        };
        for (auto it = watched_.begin(); it != watched_.end();) {
            const Watched& watched = it->second;
            const Standing now_standing = standing(watched.duplicate);
            if (now_standing == Standing::Open && (now < watched.deadline || !in_demand(watched))) {
                ++it;
                continue;
            }
            if (now_standing == Standing::Open)
                cut(watched, "no authenticated call in time");
            else
                note_ended(watched, now_standing == Standing::ClosedHere);
            ::close(watched.duplicate);
            it = watched_.erase(it);
        }
        watching_ = watched_.size();
    }
    sweeper_.expires_after(kSweepPeriod);
    sweeper_.async_wait([this](const asio::error_code& error) {
        if (!error) sweep();
    });
}

bool ConnectionGate::made_room_for(size_t from_source) {
    // Connections gRPC or the far end has closed free their places now, not at the next sweep.
    bool freed = false;
    for (auto it = watched_.begin(); it != watched_.end();) {
        const Standing now_standing = standing(it->second.duplicate);
        if (it->second.member_host || now_standing == Standing::Open) {
            ++it;
            continue;
        }
        note_ended(it->second, now_standing == Standing::ClosedHere);
        ::close(it->second.duplicate);
        it = watched_.erase(it);
        freed = true;
    }
    if (freed) return true;
    std::unordered_map<std::string, size_t> by_source;
    size_t most = 0;
    for (const auto& [key, watched] : watched_)
        if (!watched.member_host) most = std::max(most, ++by_source[watched.source]);
    if (most <= from_source) return false;
    auto oldest = watched_.end();
    for (auto it = watched_.begin(); it != watched_.end(); ++it)
        if (!it->second.member_host && by_source[it->second.source] == most &&
            (oldest == watched_.end() || it->second.deadline < oldest->second.deadline))
            oldest = it;
    cut(oldest->second, "it gave way to a connection from an address holding fewer places");
    ::close(oldest->second.duplicate);
    watched_.erase(oldest);
    return true;
}

void ConnectionGate::cut(const Watched& watched, std::string_view why) {
    note_closed(why, watched.source);
    // gRPC reads the end of the stream and closes its descriptor in turn.
    ::shutdown(watched.duplicate, SHUT_RDWR);
}

void ConnectionGate::note_ended(const Watched& watched, bool closed_here) {
    if (closed_here)
        note_closed("gRPC closed it (an unfinished handshake or a protocol error)", watched.source);
    else if (tcp_bytes_received(watched.duplicate).value_or(0) > 0)
        note_abandoned(watched.source);
}

void ConnectionGate::authenticated(const grpc::ServerContextBase& call) {
    if (watching_.load() == 0) return;
    if (const std::optional<std::string> key = connection_key_of_grpc_peer(call.peer()))
        forget(*key);
}

void ConnectionGate::note_abandoned(const std::string& source) {
    abandoned_++;
    unwarned_abandoned_++;
    if (!abandoned_warning_.due()) return;
    spdlog::warn(
        "peer: {} connection(s) were closed by the far end after it sent something but before a "
        "call, the last from {} ({} so far): a TLS handshake that refused this node's "
        "certificate, from a node with a wrong swarm secret or a certificate from another CA, or "
        "a stranger",
        unwarned_abandoned_, source, abandoned_.load());
    unwarned_abandoned_ = 0;
}

void ConnectionGate::note_closed(std::string_view why, const std::string& source) {
    closed_++;
    unwarned_++;
    if (!closed_warning_.due()) return;
    spdlog::warn(
        "peer: closed {} connection(s) before they authenticated, the last from {}: {} "
        "({} so far)",
        unwarned_, source, why, closed_.load());
    unwarned_ = 0;
}

}  // namespace starling
