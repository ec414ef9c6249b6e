// The peer port's own accept loop, in front of gRPC: it counts the connections that have not yet
// carried an authenticated call and closes what would exceed the caps, and the ones that stay
// unauthenticated too long. gRPC 1.51 caps neither; without this, a few hundred connections that
// send nothing but the HTTP/2 preface hold a descriptor each for as long as gRPC keeps them.
//
// Admitted connections go to gRPC through its external connection acceptor, so TLS, the
// handshake timeout and every channel argument still apply. The gate keeps a duplicate of each
// unauthenticated connection's descriptor: it is how the gate can cut one (shutdown() on the
// duplicate) without the risk of hitting a descriptor number gRPC has closed and reused. The
// duplicate is closed once the connection authenticates, and gRPC alone owns it from then on.
//
// A connection goes to gRPC once its first bytes show it is not a dial-back (peer/dial_back.h):
// a TLS client speaks first, so this costs no round trip. A dial-back's nonce goes to the inbox
// and its connection is closed; an observe request is answered with the caller's address and port
// as this side sees them (peer/hole_punch.h), and closed.
#pragma once

#include <asio.hpp>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "common/mutex.h"
#include "common/unique_fd.h"
#include "common/throttle.h"
#include "peer/dial_back.h"

namespace starling {

struct ConnectionLimits {
    size_t max_unauthenticated = 64;             // from all sources together but members' hosts
    size_t max_unauthenticated_per_source = 16;  // from one IP address
    // Places kept for the addresses of known members, which strangers cannot take: a member that
    // reconnects during a flood from elsewhere still gets in.
    size_t reserved_for_members = 16;
    // A connection with no authenticated call by then is closed, once places are in demand: half
    // the strangers' places, or half its address's, are held. Until then a slow handshake (a
    // member on a starved box) goes on; gRPC's handshake timeout, a little longer, still ends one
    // that never completes (peer/peer_node.cpp).
    std::chrono::milliseconds authenticate_within{10000};
};

// "address port" of a connection's far end, IPv4-mapped IPv6 addresses written as IPv4, from a
// gRPC peer string ("ipv4:10.0.0.1:7700", "ipv6:%5B::1%5D:7700"); nullopt for anything else.
std::optional<std::string> connection_key_of_grpc_peer(std::string_view peer);

class ConnectionGate {
public:
    // Binds `listen` (HOST:PORT; port 0 picks a free one) without SO_REUSEPORT, so that a port
    // in use is an error; throws starling::Error naming the address when it cannot.
    ConnectionGate(const std::string& listen, ConnectionLimits limits);
    ~ConnectionGate();  // stop()
    ConnectionGate(const ConnectionGate&) = delete;
    ConnectionGate& operator=(const ConnectionGate&) = delete;

    uint16_t port() const { return port_; }
    // Starts accepting; every admitted connection that is not a dial-back goes to `acceptor` (its
    // server has started; none: such connections are closed, as `starling check` wants).
    // `member_host` says whether an IP address is a known member's; asked with the gate's lock
    // held, only when the strangers' places are full. Dial-backs' nonces go to `inbox` (none:
    // they are dropped).
    void start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor,
               std::function<bool(const std::string& address)> member_host = {},
               DialBackInbox* inbox = nullptr);
    // Stops accepting and lets go of the connections it watches (they stay gRPC's).
    void stop();
    // A connected socket this node did not accept (a punched one, peer/hole_punch.h), admitted as
    // if it had: counted against the caps until it authenticates, then gRPC's.
    void adopt(UniqueFd fd);

    // A call on `call`'s connection proved its caller: the connection no longer counts against
    // the caps. Any thread; next to free when no connection is waiting to authenticate, as on
    // nearly every call.
    void authenticated(const grpc::ServerContextBase& call);

    // Connections the gate closed before they authenticated, over a cap or out of time.
    uint64_t closed() const { return closed_.load(); }
    // Connections the far end closed after sending something but before an authenticated call:
    // nearly always a TLS handshake in which it refused this node's certificate.
    uint64_t abandoned() const { return abandoned_.load(); }

private:
    struct Watched {
        int duplicate;  // of gRPC's descriptor
        std::string source;
        std::chrono::steady_clock::time_point deadline;
        bool member_host = false;  // admitted to the members' reserved places
    };

    // An admitted connection whose first bytes have not come yet; owns the descriptor until
    // gRPC takes it.
    struct Arriving;

    void wait_for_connections();
    void accept_ready();
    void admit(int fd, const asio::ip::tcp::endpoint& remote);
    void wait_for_first_bytes(std::shared_ptr<Arriving> arriving);
    void read_first_bytes(std::shared_ptr<Arriving> arriving);
    // The connection is no gate's business any more: no place counted, no duplicate kept.
    void forget(const std::string& key);
    void sweep();
    // With every stranger's place taken: whether to admit a connection that is not from a
    // member's host, from an address holding `from_source` places, having made room. Connections
    // already closed free their places first; then the oldest of the address holding the most gives
    // way to an address holding fewer, so a flood from many addresses cannot keep out one that is
    // not flooding.
    bool made_room_for(size_t from_source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    // Shuts a watched connection down, counted as closed for `why`.
    void cut(const Watched& watched, std::string_view why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    // Counts a watched connection that has ended: closed here (gRPC ended its handshake) or there
    // after sending something (nearly always a refused certificate).
    void note_ended(const Watched& watched, bool closed_here) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    void note_closed(std::string_view why, const std::string& source)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    void note_abandoned(const std::string& source) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

    const ConnectionLimits limits_;
    asio::io_context io_;
    asio::ip::tcp::acceptor listener_;
    asio::steady_timer backoff_;  // after the accept queue could not be drained (EMFILE)
    asio::steady_timer sweeper_;
    uint16_t port_ = 0;
    std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
    std::function<bool(const std::string&)> member_host_;
    DialBackInbox* inbox_ = nullptr;
    std::thread thread_;

    mutable Mutex mutex_;
    std::unordered_map<std::string, Watched> watched_ ABSL_GUARDED_BY(mutex_);  // by connection key
    std::atomic<size_t> watching_{0};  // watched_.size(), read without mutex_
    Throttle closed_warning_ ABSL_GUARDED_BY(mutex_){std::chrono::seconds(30)};
    uint64_t unwarned_ ABSL_GUARDED_BY(mutex_) = 0;      // closed since the last warning
    Throttle accept_warning_{std::chrono::seconds(30)};  // the io thread's alone
    Throttle abandoned_warning_ ABSL_GUARDED_BY(mutex_){std::chrono::seconds(30)};
    uint64_t unwarned_abandoned_ ABSL_GUARDED_BY(mutex_) = 0;

    std::atomic<uint64_t> closed_{0};
    std::atomic<uint64_t> abandoned_{0};
};

}  // namespace starling
