// gRPC's own log lines, through spdlog, so that they carry the daemon's format and level. A TLS
// handshake that fails is no error of this node: a stranger, or a node with another swarm secret
// or CA, can cause one per connection, so those are counted and summed up in one warning at most
// every 30 s instead of one gRPC error line each.
#pragma once

#include <cstdint>
#include <string_view>

namespace starling {

// Installs the routing for the whole process; later calls do nothing.
void route_grpc_log();

// TLS handshakes that failed in this process since the routing was installed.
uint64_t failed_tls_handshakes();

// While one lives, gRPC's lines from the source file named `file` (e.g. "chttp2_server.cc") are
// dropped: for a failure the caller reports better itself. One at a time.
class QuietGrpcSource {
public:
    explicit QuietGrpcSource(std::string_view file);
    ~QuietGrpcSource();
    QuietGrpcSource(const QuietGrpcSource&) = delete;
    QuietGrpcSource& operator=(const QuietGrpcSource&) = delete;
};

}  // namespace starling
