// The dial-back: a member asked to check another's reachability opens a plain TCP connection to
// the address that one announces and sends a preamble with the nonce it was given; the peer port's
// gate (peer/connection_gate.h) tells the preamble from TLS by its first bytes and hands the nonce
// to the node's inbox. Only the node that made the nonce can recognise it, so an arrival proves
// that the address reaches this node and not another box.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <string_view>

#include "common/mutex.h"

namespace starling {

using DialBackNonce = std::array<std::uint8_t, 16>;
DialBackNonce random_dial_back_nonce();

// 8 bytes no TLS record (first byte 0x16) nor HTTP/2 preface ("PRI ") begins with, then the nonce.
inline constexpr std::string_view kDialBackMagic = "STRLDB1\n";
// The same length, for a node asking where its connection comes from (peer/hole_punch.h); the
// port answers with the caller's address and port as it sees them.
inline constexpr std::string_view kObserveMagic = "STRLOB1\n";
inline constexpr size_t kDialBackPreambleBytes = kDialBackMagic.size() + sizeof(DialBackNonce);

enum class Preamble {
    Other,       // not a dial-back: the connection is gRPC's
    Incomplete,  // a magic so far, but not all of the preamble yet
    DialBack,    // the whole preamble: its nonce follows the magic
    Observe,     // the whole preamble of an observe request
};
Preamble classify_preamble(std::span<const std::uint8_t> first_bytes);
DialBackNonce nonce_of_preamble(std::span<const std::uint8_t> preamble);

// Connects to `address` (host:port) and writes the preamble with `nonce`, all within `timeout`.
// "" when it did, else why not ("Connection refused", "no answer within 3000 ms", ...). Gives up
// within 100 ms once `cancelled` is set.
std::string dial_back(const std::string& address, const DialBackNonce& nonce,
                      std::chrono::milliseconds timeout,
                      const std::atomic<bool>* cancelled = nullptr);

// The nonces that arrived at this node's port lately.
class DialBackInbox {
public:
    void arrived(const DialBackNonce& nonce);
    // Whether `nonce` arrives (or has) within `limit`.
    bool wait_for(const DialBackNonce& nonce, std::chrono::milliseconds limit);

private:
    static constexpr size_t kKept = 64;
    Mutex mutex_;
    std::condition_variable changed_;
    std::deque<DialBackNonce> seen_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace starling
