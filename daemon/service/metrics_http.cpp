#include "daemon/service/metrics_http.h"

#include <chrono>
#include <memory>
#include <sstream>

#include "common/error.h"
#include "peer/address.h"

namespace starling {

namespace {

constexpr size_t kMaxRequestBytes = 8192;  // a scrape's request line and headers
constexpr std::chrono::seconds kRequestTimeout{10};

std::string response(const std::string& status, const std::string& content_type,
                     const std::string& body) {
    return "HTTP/1.1 " + status + "\r\nContent-Type: " + content_type +
           "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
           body;
}

// One request: read the head (bounded in size and time), answer, close.
class Exchange : public std::enable_shared_from_this<Exchange> {
public:
    Exchange(asio::ip::tcp::socket socket, const std::function<std::string()>& body)
        : socket_(std::move(socket)),
          request_(kMaxRequestBytes),
          deadline_(socket_.get_executor()),
          body_(body) {}

    void start() {
        deadline_.expires_after(kRequestTimeout);
        deadline_.async_wait([self = shared_from_this()](const asio::error_code& error) {
            if (!error) self->socket_.close();
        });
        asio::async_read_until(socket_, request_, "\r\n\r\n",
                               [self = shared_from_this()](const asio::error_code& error, size_t) {
                                   if (!error) self->answer();
                               });
    }

private:
    void answer() {
        std::istream in(&request_);
        std::string method, target;
        in >> method >> target;
        if (method != "GET") {
            reply_ = response("405 Method Not Allowed", "text/plain", "only GET\n");
        } else if (target != "/metrics") {
            reply_ = response("404 Not Found", "text/plain", "see /metrics\n");
        } else {
            reply_ = response("200 OK", "text/plain; version=0.0.4; charset=utf-8", body_());
        }
        asio::async_write(socket_, asio::buffer(reply_),
                          [self = shared_from_this()](const asio::error_code&, size_t) {
                              self->deadline_.cancel();
                              asio::error_code ignored;
                              self->socket_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
                              self->socket_.close(ignored);
                          });
    }

    asio::ip::tcp::socket socket_;
    asio::streambuf request_;
    asio::steady_timer deadline_;
    const std::function<std::string()>& body_;
    std::string reply_;
};

asio::ip::tcp::endpoint endpoint_of(asio::io_context& io, const std::string& listen) {
    const std::optional<HostPort> address = parse_host_port(listen);
    if (!address) throw Error("[metrics].listen: \"" + listen + "\" is not HOST:PORT");
    asio::error_code error;
    asio::ip::tcp::resolver resolver(io);
    const auto results = resolver.resolve(address->host, std::to_string(address->port),
                                          asio::ip::tcp::resolver::passive, error);
    if (error || results.empty()) {
        throw Error("[metrics].listen: cannot resolve " + listen + ": " + error.message());
    }
    return results.begin()->endpoint();
}

}  // namespace

MetricsHttpServer::MetricsHttpServer(const std::string& listen, std::function<std::string()> body)
    : body_(std::move(body)), acceptor_(io_) {
    const asio::ip::tcp::endpoint endpoint = endpoint_of(io_, listen);
    asio::error_code error;
    acceptor_.open(endpoint.protocol(), error);
    if (!error) acceptor_.set_option(asio::socket_base::reuse_address(true), error);
    if (!error) acceptor_.bind(endpoint, error);
    if (!error) acceptor_.listen(asio::socket_base::max_listen_connections, error);
    if (error)
        throw Error("[metrics].listen: cannot serve /metrics on " + listen + ": " +
                    error.message());
    accept();
    thread_ = std::thread([this] { io_.run(); });
}

MetricsHttpServer::~MetricsHttpServer() {
    io_.stop();
    thread_.join();
}

uint16_t MetricsHttpServer::port() const { return acceptor_.local_endpoint().port(); }

void MetricsHttpServer::accept() {
    acceptor_.async_accept([this](const asio::error_code& error, asio::ip::tcp::socket socket) {
        if (!error) std::make_shared<Exchange>(std::move(socket), body_)->start();
        accept();
    });
}

}  // namespace starling
