// A TCP connection to a port on 127.0.0.1 at the byte level, for the tests of what a node's gates
// do with callers that are not gRPC clients: ones that send nothing, or hostile bytes.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <string>

namespace starling::test {

inline sockaddr_in loopback(uint16_t port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return address;
}

class RawConnection {
public:
    // Connected from `source` (an address of the loopback network).
    explicit RawConnection(uint16_t port, const char* source = "127.0.0.1")
        : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
        REQUIRE(fd_ >= 0);
        sockaddr_in from{};
        from.sin_family = AF_INET;
        REQUIRE(inet_pton(AF_INET, source, &from.sin_addr) == 1);
        REQUIRE(bind(fd_, reinterpret_cast<sockaddr*>(&from), sizeof(from)) == 0);
        const sockaddr_in to = loopback(port);
        REQUIRE(connect(fd_, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) == 0);
    }
    ~RawConnection() { close(fd_); }
    RawConnection(const RawConnection&) = delete;
    RawConnection& operator=(const RawConnection&) = delete;

    // Whether all of `bytes` went out (false once the far end has closed).
    bool send(const std::string& bytes) const {
        return ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) ==
               static_cast<ssize_t>(bytes.size());
    }

    // Whether the far end closed it within `limit`: anything it sends is read and dropped until
    // the end of the stream or a reset.
    bool closed_within(std::chrono::milliseconds limit) const {
        const auto until = std::chrono::steady_clock::now() + limit;
        for (;;) {
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                until - std::chrono::steady_clock::now());
            if (left <= std::chrono::milliseconds(0)) return false;
            pollfd p{fd_, POLLIN, 0};
            if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
            char buffer[4096];
            const ssize_t n = recv(fd_, buffer, sizeof(buffer), MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return true;
        }
    }

private:
    int fd_;
};

}  // namespace starling::test
