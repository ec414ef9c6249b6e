// A TCP relay that adds a fixed one-way delay in each direction, for emulating a wide-area round
// trip where the kernel's netem is unavailable: every byte read from one side is written to the
// other `delay` later. Bandwidth is left to whatever shapes the link (tc tbf); the relay buffers
// at most --max-buffer-mb per direction and then stops reading, which TCP turns into backpressure.
//   delay_relay --listen 10.0.0.1:9000 --target 10.0.0.2:7000 --delay-ms 20
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "peer/address.h"

namespace {

using Clock = std::chrono::steady_clock;

int connect_to(const starling::HostPort& at) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(at.host.c_str(), std::to_string(at.port).c_str(), &hints, &found) != 0)
        return -1;
    int fd = -1;
    for (addrinfo* a = found; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(found);
    return fd;
}

// One direction: a reader stamps what it reads, a writer sends each piece once its time is due.
class DelayedPipe {
public:
    DelayedPipe(int from, int to, std::chrono::milliseconds delay, size_t max_buffered)
        : from_(from), to_(to), delay_(delay), max_buffered_(max_buffered) {}

    void run() {
        std::thread writer([this] { write_loop(); });
        std::vector<char> buffer(256 << 10);
        for (;;) {
            const ssize_t n = read(from_, buffer.data(), buffer.size());
            std::unique_lock lock(mutex_);
            if (n <= 0) {
                closed_ = true;
                changed_.notify_all();
                break;
            }
            changed_.wait(lock, [&] { return buffered_ < max_buffered_ || failed_; });
            if (failed_) break;
            queue_.push_back({Clock::now() + delay_, std::string(buffer.data(), n)});
            buffered_ += n;
            changed_.notify_all();
        }
        writer.join();
        shutdown(to_, SHUT_WR);
    }

private:
    struct Piece {
        Clock::time_point due;
        std::string bytes;
    };

    void write_loop() {
        for (;;) {
            Piece piece;
            {
                std::unique_lock lock(mutex_);
                changed_.wait(lock, [&] { return !queue_.empty() || closed_; });
                if (queue_.empty()) return;
                piece = std::move(queue_.front());
                queue_.pop_front();
            }
            std::this_thread::sleep_until(piece.due);
            for (size_t sent = 0; sent < piece.bytes.size();) {
                // MSG_NOSIGNAL: a peer that resets its connection (iperf3 closing a data socket
                // with bytes unread) must end this connection's pipes, not the whole relay by
                // SIGPIPE.
                const ssize_t n =
                    send(to_, piece.bytes.data() + sent, piece.bytes.size() - sent, MSG_NOSIGNAL);
                if (n <= 0) {
                    std::lock_guard lock(mutex_);
                    failed_ = true;
                    changed_.notify_all();
                    return;
                }
                sent += n;
            }
            std::lock_guard lock(mutex_);
            buffered_ -= piece.bytes.size();
            changed_.notify_all();
        }
    }

    int from_, to_;
    std::chrono::milliseconds delay_;
    size_t max_buffered_;
    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<Piece> queue_;
    size_t buffered_ = 0;
    bool closed_ = false;
    bool failed_ = false;
};

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"TCP relay adding a fixed one-way delay in each direction"};
    std::string listen_text, target_text;
    int delay_ms = 20;
    size_t max_buffer_mb = 64;
    app.add_option("--listen", listen_text, "host:port to accept on")->required();
    app.add_option("--target", target_text, "host:port to forward to")->required();
    app.add_option("--delay-ms", delay_ms, "one-way delay added in each direction");
    app.add_option("--max-buffer-mb", max_buffer_mb,
                   "bytes held per direction before reading pauses");
    CLI11_PARSE(app, argc, argv);
    const auto listen_at = starling::parse_host_port(listen_text);
    const auto target = starling::parse_host_port(target_text);
    if (!listen_at || !target) {
        std::fprintf(stderr, "delay_relay: --listen and --target must be host:port\n");
        return 2;
    }
    const int server = socket(AF_INET, SOCK_STREAM, 0);
    const int yes = 1;
    setsockopt(server, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(listen_at->port);
    if (inet_pton(AF_INET, listen_at->host.c_str(), &addr.sin_addr) != 1 ||
        bind(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        listen(server, 64) != 0) {
        std::perror(("delay_relay: cannot listen on " + listen_text).c_str());
        return 1;
    }
    std::printf("delay_relay: %s -> %s, %d ms each way\n", listen_text.c_str(), target_text.c_str(),
                delay_ms);
    std::fflush(stdout);
    for (;;) {
        const int client = accept(server, nullptr, nullptr);
        if (client < 0) continue;
        const int upstream = connect_to(*target);
        if (upstream < 0) {
            std::fprintf(stderr, "delay_relay: cannot reach %s\n", target_text.c_str());
            close(client);
            continue;
        }
        for (int fd : {client, upstream})
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
        std::thread([=] {
            const auto delay = std::chrono::milliseconds(delay_ms);
            DelayedPipe up(client, upstream, delay, max_buffer_mb << 20);
            DelayedPipe down(upstream, client, delay, max_buffer_mb << 20);
            std::thread back([&] { down.run(); });
            up.run();
            back.join();
            close(client);
            close(upstream);
        }).detach();
    }
}
