// The frame reader of the control port's gate on hand-built HTTP/2 bytes (RFC 9113 framing, as
// tests/support/http2_flood.h writes it), whole and cut anywhere.
#include <catch2/catch.hpp>
#include <random>

#include "daemon/service/http2_client_frames.h"
#include "tests/support/http2_flood.h"

using namespace starling;
using namespace starling::test;

namespace {

std::string frame(uint8_t type, uint32_t stream, const std::string& payload = "",
                  uint8_t flags = 0) {
    const auto length = static_cast<uint32_t>(payload.size());
    std::string bytes{static_cast<char>(length >> 16), static_cast<char>(length >> 8),
                      static_cast<char>(length),       static_cast<char>(type),
                      static_cast<char>(flags),        static_cast<char>(stream >> 24),
                      static_cast<char>(stream >> 16), static_cast<char>(stream >> 8),
                      static_cast<char>(stream)};
    return bytes + payload;
}

const std::string kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const std::string kCancel("\0\0\0\x8", 4);  // RST_STREAM's error code

// All of `bytes` read in pieces of 1 to `most` bytes, the activity summed.
Http2ClientActivity read_in_pieces(const std::string& bytes, size_t most, uint32_t seed) {
    Http2ClientFrames frames;
    std::mt19937 random(seed);
    Http2ClientActivity total;
    for (size_t at = 0; at < bytes.size();) {
        const size_t n =
            std::min(bytes.size() - at, std::uniform_int_distribution<size_t>(1, most)(random));
        const Http2ClientActivity piece = frames.read({bytes.data() + at, n});
        total.opened += piece.opened;
        total.reset += piece.reset;
        if (total.violation.empty()) total.violation = piece.violation;
        at += n;
    }
    return total;
}

}  // namespace

TEST_CASE("the frame reader counts the streams a rapid reset opens and resets, however cut") {
    const std::string bytes = rapid_reset_bytes(300);
    const size_t most = GENERATE(1, 7, 64, 100000);
    const Http2ClientActivity activity = read_in_pieces(bytes, most, 11);
    CHECK(activity.violation.empty());
    CHECK(activity.opened == 300);
    CHECK(activity.reset == 300);
}

TEST_CASE("the frame reader counts a call's trailers and body on its own stream, not new ones") {
    const std::string headers = "\x83\x86";  // any HPACK: the reader never decodes it
    const std::string bytes = kPreface + frame(0x4, 0) + frame(0x1, 1, headers, 0x4) +
                              frame(0x0, 1, std::string(20, 'x')) + frame(0x1, 1, headers, 0x5) +
                              frame(0x8, 0, std::string("\0\0\0\1", 4)) +
                              frame(0x6, 0, std::string(8, 'p')) + frame(0x1, 3, headers, 0x4) +
                              frame(0x9, 3, headers, 0x4) + frame(0x1, 7, headers, 0x4) +
                              frame(0x3, 3, kCancel);
    const Http2ClientActivity activity = read_in_pieces(bytes, 5, 3);
    CHECK(activity.violation.empty());
    CHECK(activity.opened == 3);  // streams 1, 3 and 7
    CHECK(activity.reset == 1);
}

TEST_CASE("the frame reader names what no client may send, and reads nothing after it") {
    const std::string open = kPreface + frame(0x4, 0) + frame(0x1, 1, "\x83", 0x4);
    const auto violation_of = [&](const std::string& bad) {
        Http2ClientFrames frames;
        const Http2ClientActivity first = frames.read({open.data(), open.size()});
        REQUIRE(first.violation.empty());
        const std::string after = bad + rapid_reset_bytes(5, 101, false);
        const Http2ClientActivity activity = frames.read({after.data(), after.size()});
        CHECK(activity.opened == 0);
        CHECK(activity.reset == 0);
        // Still broken: what comes later is not read either.
        const std::string more = rapid_reset_bytes(5, 201, false);
        CHECK(frames.read({more.data(), more.size()}).opened == 0);
        return activity.violation;
    };
    CHECK_THAT(violation_of(frame(0x1, 0, "\x83", 0x4)), Catch::Contains("HEADERS on stream 0"));
    CHECK_THAT(violation_of(frame(0x1, 4, "\x83", 0x4)), Catch::Contains("HEADERS on stream 4"));
    CHECK_THAT(violation_of(frame(0x0, 9, "body")),
               Catch::Contains("DATA on stream 9") && Catch::Contains("never opened"));
    CHECK_THAT(violation_of(frame(0x0, 0, "body")), Catch::Contains("DATA on stream 0"));
    CHECK_THAT(violation_of(frame(0x3, 5, kCancel)), Catch::Contains("RST_STREAM on stream 5"));
    CHECK_THAT(violation_of(frame(0x5, 1, std::string("\0\0\0\2", 4))),
               Catch::Contains("PUSH_PROMISE"));

    Http2ClientFrames not_http2;
    const std::string get = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK_THAT(not_http2.read({get.data(), get.size()}).violation,
               Catch::Contains("HTTP/2 client preface"));
}
