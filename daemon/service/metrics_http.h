// The HTTP endpoint Prometheus scrapes: GET /metrics answered with the text format, anything else
// 404, one request per connection, on a thread of its own.
//
// Served here with Asio rather than by prometheus-cpp's pull exposer: that one runs civetweb,
// whose worker threads have fixed 100 KB stacks, and the static thread-local storage of the CUDA
// runtime linked into starlingd left a scrape too little of them (it crashed the daemon). This
// thread has the default stack.
#pragma once

#include <asio.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace starling {

class MetricsHttpServer {
public:
    // Listens on `listen` (host:port; port 0 picks a free one); throws starling::Error naming
    // the address when it cannot. `body` is called on the server's thread for every scrape.
    MetricsHttpServer(const std::string& listen, std::function<std::string()> body);
    ~MetricsHttpServer();
    MetricsHttpServer(const MetricsHttpServer&) = delete;
    MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

    uint16_t port() const;

private:
    void accept();

    std::function<std::string()> body_;
    asio::io_context io_;
    asio::ip::tcp::acceptor acceptor_;
    std::thread thread_;
};

}  // namespace starling
