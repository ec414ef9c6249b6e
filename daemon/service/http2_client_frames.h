// What a client sends on an HTTP/2 connection, read frame by frame as its bytes pass through:
// the streams it opens, the ones it resets, and what no well-behaved client sends. The control
// port's gate uses it because gRPC 1.51 bounds neither resets nor calls queued for a thread
// (CVE-2023-44487); only frame headers are read, never HPACK or bodies.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace starling {

struct Http2ClientActivity {
    uint64_t opened = 0;  // HEADERS frames that opened a new stream
    uint64_t reset = 0;   // RST_STREAM frames on streams the client opened
    // Why the connection breaks HTTP/2 (RFC 9113), empty when it does not; nothing after it is
    // read.
    std::string violation;
};

class Http2ClientFrames {
public:
    // Reads the next bytes the client sent: what they hold in frames whole or begun.
    Http2ClientActivity read(std::span<const char> bytes);

private:
    void on_frame_header(Http2ClientActivity& activity);

    size_t preface_seen_ = 0;
    std::array<unsigned char, 9> header_{};
    size_t header_seen_ = 0;
    uint32_t payload_left_ = 0;
    uint32_t last_opened_ = 0;  // the highest stream id the client opened
    bool broken_ = false;
};

}  // namespace starling
