#include "daemon/service/http2_client_frames.h"

#include <algorithm>
#include <string_view>

namespace starling {
namespace {

constexpr std::string_view kPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

enum FrameType : uint8_t {
    kData = 0x0,
    kHeaders = 0x1,
    kRstStream = 0x3,
    kPushPromise = 0x5,
};

}  // namespace

Http2ClientActivity Http2ClientFrames::read(std::span<const char> bytes) {
    Http2ClientActivity activity;
    if (broken_) return activity;
    size_t at = 0;
    while (at < bytes.size()) {
        if (preface_seen_ < kPreface.size()) {
            const size_t n = std::min(kPreface.size() - preface_seen_, bytes.size() - at);
            if (std::string_view(bytes.data() + at, n) != kPreface.substr(preface_seen_, n)) {
                activity.violation = "it did not open with the HTTP/2 client preface";
                break;
            }
            preface_seen_ += n;
            at += n;
        } else if (payload_left_ > 0) {
            const size_t n = std::min<size_t>(payload_left_, bytes.size() - at);
            payload_left_ -= static_cast<uint32_t>(n);
            at += n;
        } else {
            header_.at(header_seen_++) = static_cast<unsigned char>(bytes[at++]);
            if (header_seen_ < header_.size()) continue;
            header_seen_ = 0;
            on_frame_header(activity);
            if (!activity.violation.empty()) break;
        }
    }
    broken_ = !activity.violation.empty();
    return activity;
}

void Http2ClientFrames::on_frame_header(Http2ClientActivity& activity) {
    payload_left_ = (uint32_t{header_[0]} << 16) | (uint32_t{header_[1]} << 8) | header_[2];
    const uint8_t type = header_[3];
    const uint32_t stream = ((uint32_t{header_[5]} << 24) | (uint32_t{header_[6]} << 16) |
                             (uint32_t{header_[7]} << 8) | header_[8]) &
                            0x7fffffffu;
    switch (type) {
        case kHeaders:
            if (stream == 0 || stream % 2 == 0)
                activity.violation =
                    "HEADERS on stream " + std::to_string(stream) + ", which no client may open";
            else if (stream > last_opened_) {
                last_opened_ = stream;
                activity.opened++;
            }
            break;
        case kData:
        case kRstStream:
            if (stream == 0 || stream > last_opened_)
                activity.violation = std::string(type == kData ? "DATA" : "RST_STREAM") +
                                     " on stream " + std::to_string(stream) +
                                     ", which it never opened";
            else if (type == kRstStream)
                activity.reset++;
            break;
        case kPushPromise: activity.violation = "PUSH_PROMISE, which only a server sends"; break;
        default: break;
    }
}

}  // namespace starling
