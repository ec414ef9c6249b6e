#include "daemon/service/control_gate.h"

#include <spdlog/spdlog.h>

#include <array>
#include <functional>
#include <future>

#include "daemon/service/http2_client_frames.h"
#include "peer/listen_address.h"

namespace starling {
namespace {

// After accept() failed for want of descriptors or memory: the listener stays readable, so
// accepting again at once would spin.
constexpr auto kAcceptBackoff = std::chrono::milliseconds(100);

}  // namespace

// One client connection and its socket pair to gRPC: the client's bytes go up once their frames
// are read, gRPC's come down as they are.
class ControlGate::Link : public std::enable_shared_from_this<Link> {
public:
    Link(ControlGate& gate, asio::ip::tcp::socket client, asio::local::stream_protocol::socket up,
         std::string source)
        : gate_(gate),
          client_(std::move(client)),
          grpc_(std::move(up)),
          delay_(gate.io_),
          source_(std::move(source)),
          resets_(gate.limits_.resets_per_second, gate.limits_.reset_burst) {}

    void start() {
        read_client();
        read_grpc();
    }

    void close() {
        asio::error_code ignored;
        client_.close(ignored);
        grpc_.close(ignored);
        delay_.cancel();
    }

    // Reads nothing more from the client; gRPC's answers still go down.
    void hold() {
        holding_ = true;
        asio::error_code ignored;
        client_.shutdown(asio::socket_base::shutdown_receive, ignored);
        delay_.cancel();
    }

    const std::string& source() const { return source_; }

private:
    void read_client() {
        client_.async_read_some(
            asio::buffer(from_client_),
            [self = shared_from_this()](const asio::error_code& error, size_t n) {
                if (self->holding_) return;
                if (error) return self->gate_.close(self, "");
                self->pass_up(n);
            });
    }

    void pass_up(size_t n) {
        const Http2ClientActivity activity = frames_.read({from_client_.data(), n});
        if (!activity.violation.empty())
            return gate_.close(shared_from_this(), "it broke HTTP/2: " + activity.violation);
        if (!resets_.take(static_cast<double>(activity.reset)))
            return gate_.close(shared_from_this(),
                               "it reset streams faster than its budget (HTTP/2 rapid reset)");
        const auto wait = gate_.streams_.take_on_credit(static_cast<double>(activity.opened));
        if (wait == std::chrono::steady_clock::duration::zero()) return write_up(n);
        delay_.expires_after(wait);
        delay_.async_wait([self = shared_from_this(), n](const asio::error_code& error) {
            if (!error) self->write_up(n);
        });
    }

    void write_up(size_t n) {
        asio::async_write(grpc_, asio::buffer(from_client_, n),
                          [self = shared_from_this()](const asio::error_code& error, size_t) {
                              if (error) return self->gate_.close(self, "");
                              self->read_client();
                          });
    }

    void read_grpc() {
        grpc_.async_read_some(asio::buffer(from_grpc_),
                              [self = shared_from_this()](const asio::error_code& error, size_t n) {
                                  if (error) return self->gate_.close(self, "");
                                  asio::async_write(
                                      self->client_, asio::buffer(self->from_grpc_, n),
                                      [self](const asio::error_code& write_error, size_t) {
                                          if (write_error) return self->gate_.close(self, "");
                                          self->read_grpc();
                                      });
                              });
    }

    ControlGate& gate_;
    asio::ip::tcp::socket client_;
    asio::local::stream_protocol::socket grpc_;
    asio::steady_timer delay_;
    std::string source_;
    bool holding_ = false;
    Http2ClientFrames frames_;
    TokenBucket resets_;
    std::array<char, 16384> from_client_{};
    std::array<char, 16384> from_grpc_{};
};

ControlGate::ControlGate(const std::string& listen, ControlLimits limits)
    : limits_(limits),
      listener_(io_),
      backoff_(io_),
      streams_(limits.streams_per_second, limits.stream_burst) {
    listen_on(listener_, listen, "[control].listen", "listen");
    port_ = listener_.local_endpoint().port();
}

ControlGate::~ControlGate() { stop(); }

void ControlGate::start(std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor) {
    acceptor_ = std::move(acceptor);
    accept_next();
    thread_ = std::thread([this] { io_.run(); });
}

void ControlGate::stop_reading() {
    if (!thread_.joinable()) return;
    on_io_thread([this] {
        stop_accepting();
        for (const auto& link : links_) link->hold();
    });
}

void ControlGate::on_io_thread(const std::function<void()>& work) {
    std::promise<void> done;
    asio::post(io_, [&] {
        work();
        done.set_value();
    });
    done.get_future().wait();
}

void ControlGate::stop() {
    if (!thread_.joinable()) return;
    on_io_thread([this] {
        stop_accepting();
        for (const auto& link : links_) link->close();
        links_.clear();
    });
    io_.stop();
    thread_.join();
}

void ControlGate::stop_accepting() {
    asio::error_code ignored;
    listener_.close(ignored);
    backoff_.cancel();
}

void ControlGate::accept_next() {
    listener_.async_accept([this](const asio::error_code& error, asio::ip::tcp::socket client) {
        if (error == asio::error::operation_aborted) return;
        if (!error) {
            admit(std::move(client));
            return accept_next();
        }
        if (accept_warning_.due())
            spdlog::warn("control: cannot accept a connection: {}; trying again", error.message());
        backoff_.expires_after(kAcceptBackoff);
        backoff_.async_wait([this](const asio::error_code& wait_error) {
            if (!wait_error) accept_next();
        });
    });
}

void ControlGate::admit(asio::ip::tcp::socket client) {
    asio::error_code error;
    const auto remote = client.remote_endpoint(error);
    const std::string source = error ? "an unknown address" : remote.address().to_string();
    if (links_.size() >= limits_.max_connections)
        return note_closed("the cap on connections open at once", source);
    asio::local::stream_protocol::socket ours(io_), theirs(io_);
    asio::local::connect_pair(ours, theirs, error);
    // gRPC reads its end without blocking, as it does every socket it accepts itself.
    if (!error) theirs.non_blocking(true, error);
    if (error) return note_closed("no socket pair for it: " + error.message(), source);
    client.set_option(asio::ip::tcp::no_delay(true), error);
    grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters connection;
    connection.listener_fd = listener_.native_handle();
    connection.fd = theirs.release();  // gRPC's from here on
    acceptor_->HandleNewConnection(&connection);
    auto link = std::make_shared<Link>(*this, std::move(client), std::move(ours), source);
    links_.insert(link);
    link->start();
}

void ControlGate::close(const std::shared_ptr<Link>& link, std::string_view why) {
    if (links_.erase(link) == 0) return;
    // Counted first: whoever sees the connection end may read the count at once.
    if (!why.empty()) note_closed(why, link->source());
    link->close();
}

void ControlGate::note_closed(std::string_view why, const std::string& source) {
    closed_++;
    unwarned_++;
    if (!closed_warning_.due()) return;
    spdlog::warn("control: closed {} connection(s), the last from {}: {} ({} so far)", unwarned_,
                 source, why, closed_.load());
    unwarned_ = 0;
}

}  // namespace starling
