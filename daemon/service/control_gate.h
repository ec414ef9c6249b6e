// The control port's own accept loop, in front of gRPC. gRPC 1.51 queues a call for every stream
// a client opens, whether or not the client resets it at once (HTTP/2 rapid reset,
// CVE-2023-44487): a local flood grew a node by gigabytes and kept it from exiting on SIGTERM.
// The gate passes each client's bytes to gRPC through a socket pair and reads their frame headers
// on the way (Http2ClientFrames): it closes a connection that resets streams faster than its
// budget or breaks HTTP/2, delays every client's new streams past a budget for all of them
// together, and caps the connections open at once. gRPC's answers pass back untouched.
#pragma once

#include <grpcpp/server_builder.h>

#include <asio.hpp>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_set>

#include "common/throttle.h"
#include "common/token_bucket.h"

namespace starling {

struct ControlLimits {
    size_t max_connections = 256;  // open at once; one more is closed at once
    // Resets one connection may send: a client cancels a call now and then, a flood thousands of
    // times a second.
    double resets_per_second = 8;
    double reset_burst = 64;
    // New streams of all connections together that reach gRPC; past them a connection's bytes
    // wait, so a flood slows every caller down instead of filling the node's memory.
    double streams_per_second = 256;
    double stream_burst = 256;
};

class ControlGate {
public:
    // Binds `listen` (HOST:PORT; port 0 picks a free one) without SO_REUSEPORT; throws
    // starling::Error naming [control].listen and the address when it cannot.
    ControlGate(const std::string& listen, ControlLimits limits = {});
    ~ControlGate();  // stop()
    ControlGate(const ControlGate&) = delete;
    ControlGate& operator=(const ControlGate&) = delete;

    uint16_t port() const { return port_; }
    // Starts accepting; every admitted connection goes to `acceptor` (its server has started).
    void start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor);
    // Stops accepting and reads no more from any client, so no new call reaches gRPC while it
    // drains; its answers still reach the callers.
    void stop_reading();
    // Stops accepting and closes every connection, so that gRPC's calls on them end.
    void stop();

    // Connections the gate closed: over the cap, a flood of resets, or a breach of HTTP/2.
    uint64_t closed() const { return closed_.load(); }

private:
    class Link;

    // Runs `work` on the io thread and returns once it has.
    void on_io_thread(const std::function<void()>& work);
    void stop_accepting();  // on the io thread
    void accept_next();
    void admit(asio::ip::tcp::socket client);
    void close(const std::shared_ptr<Link>& link, std::string_view why);
    void note_closed(std::string_view why, const std::string& source);

    const ControlLimits limits_;
    asio::io_context io_;
    // Keeps io_.run() going until stop(), even when nothing is left to wait for.
    asio::executor_work_guard<asio::io_context::executor_type> running_{io_.get_executor()};
    asio::ip::tcp::acceptor listener_;
    asio::steady_timer backoff_;  // after accept() failed (descriptors or memory ran out)
    uint16_t port_ = 0;
    std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor_;
    std::thread thread_;

    // The io thread's alone.
    std::unordered_set<std::shared_ptr<Link>> links_;
    TokenBucket streams_;
    Throttle closed_warning_{std::chrono::seconds(30)};
    Throttle accept_warning_{std::chrono::seconds(30)};
    uint64_t unwarned_ = 0;

    std::atomic<uint64_t> closed_{0};
};

}  // namespace starling
