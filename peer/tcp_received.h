// Bytes a TCP socket has received so far, from the kernel's tcp_info. Its own file because
// glibc's copy of that struct (netinet/tcp.h) predates the field, and the kernel's header
// (linux/tcp.h) cannot be included beside glibc's.
#pragma once

#include <cstdint>
#include <optional>

namespace starling {

// nullopt when the kernel cannot say (not a TCP socket, a kernel before 4.1).
std::optional<uint64_t> tcp_bytes_received(int fd);

}  // namespace starling
