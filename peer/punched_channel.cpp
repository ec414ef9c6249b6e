#include "peer/punched_channel.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <grpcpp/create_channel.h>

#include <array>
#include <cerrno>
#include <string>
#include <vector>

#include "common/errno_text.h"
#include "common/error.h"

namespace starling {

namespace {

constexpr size_t kSpliceBuffer = 256 * 1024;

// Writes all of `bytes` to a blocking socket; false when it fails (the far end gone, or shut down
// by the destructor).
bool write_all(int fd, const char* bytes, size_t size) {
    while (size > 0) {
        const ssize_t sent = ::send(fd, bytes, size, MSG_NOSIGNAL);
        if (sent < 0 && errno == EINTR) continue;
        if (sent <= 0) return false;
        bytes += sent;
        size -= static_cast<size_t>(sent);
    }
    return true;
}

void set_blocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK); }

}  // namespace

PunchedChannel::PunchedChannel(UniqueFd punched,
                               const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                               const grpc::ChannelArguments& arguments)
    : punched_(std::move(punched)),
      listener_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)),
      stop_(::eventfd(0, EFD_CLOEXEC)) {
    if (!listener_ || !stop_) throw Error("cannot open a loopback socket: " + errno_text(errno));
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(local);
    if (::bind(listener_.get(), reinterpret_cast<const sockaddr*>(&local), sizeof(local)) != 0 ||
        ::listen(listener_.get(), 1) != 0 ||
        ::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0)
        throw Error("cannot listen on loopback for a punched connection: " + errno_text(errno));
    set_blocking(punched_.get());
    channel_ = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(ntohs(local.sin_port)),
                                         credentials, arguments);
    thread_ = std::thread([this] { splice(); });
}

PunchedChannel::~PunchedChannel() {
    const uint64_t one = 1;
    (void)!::write(stop_.get(), &one, sizeof(one));
    ::shutdown(punched_.get(), SHUT_RDWR);  // a splice blocked in a write returns
    thread_.join();
}

void PunchedChannel::splice() {
    // The first connection to the listener is gRPC's; the listener takes no other.
    std::array<pollfd, 2> accepting{pollfd{listener_.get(), POLLIN, 0},
                                    pollfd{stop_.get(), POLLIN, 0}};
    while (::poll(accepting.data(), accepting.size(), -1) < 0 && errno == EINTR) {
    }
    if (accepting[1].revents != 0) return;
    const UniqueFd local(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    listener_.reset();
    if (!local) return;
    const int one = 1;
    ::setsockopt(local.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

    std::vector<char> buffer(kSpliceBuffer);
    // Each direction: from, to, and whether it has ended (its far end finished sending).
    struct Direction {
        int from, to;
        bool ended = false;
    };
    std::array<Direction, 2> directions{Direction{local.get(), punched_.get()},
                                        Direction{punched_.get(), local.get()}};
    while (!directions[0].ended || !directions[1].ended) {
        std::array<pollfd, 3> waits{
            pollfd{directions[0].ended ? -1 : directions[0].from, POLLIN, 0},
            pollfd{directions[1].ended ? -1 : directions[1].from, POLLIN, 0},
            pollfd{stop_.get(), POLLIN, 0}};
        if (::poll(waits.data(), waits.size(), -1) < 0) {
            if (errno == EINTR) continue;
            return;
        }
        if (waits[2].revents != 0) return;
        for (size_t i = 0; i < directions.size(); i++) {
            Direction& d = directions[i];
            if (d.ended || waits[i].revents == 0) continue;
            const ssize_t got = ::recv(d.from, buffer.data(), buffer.size(), 0);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {
                d.ended = true;
                ::shutdown(d.to, SHUT_WR);
                continue;
            }
            if (!write_all(d.to, buffer.data(), static_cast<size_t>(got))) return;
        }
    }
}

}  // namespace starling
