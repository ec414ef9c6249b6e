#include "daemon/service/metrics_http.h"

#include <chrono>
#include <memory>
#include <sstream>

#include "common/error.h"
#include "peer/listen_address.h"

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

}  // namespace

MetricsHttpServer::MetricsHttpServer(const std::string& listen, std::function<std::string()> body)
    : body_(std::move(body)), acceptor_(io_) {
    listen_on(acceptor_, listen, "[metrics].listen", "serve /metrics");
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
