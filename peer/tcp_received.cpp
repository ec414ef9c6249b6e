#include "peer/tcp_received.h"

#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>

namespace starling {

std::optional<uint64_t> tcp_bytes_received(int fd) {
    tcp_info info{};
    socklen_t length = sizeof(info);
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return std::nullopt;
    const size_t needed =
        offsetof(tcp_info, tcpi_bytes_received) + sizeof(info.tcpi_bytes_received);
    if (length < needed) return std::nullopt;
    return info.tcpi_bytes_received;
}

}  // namespace starling
