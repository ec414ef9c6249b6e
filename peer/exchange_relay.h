// An anchor's relay for the exchange of two members that cannot be dialed (docs/nat.md): neither
// can open a stream to the other, but both can open one to a member that can be dialed. Their
// pairing names the relay (PairRequest.relay, the anchor the proposal went through); each side then
// streams its exchange there (RelayExchange, with the partner's id in `starling-relay-to`), and
// the relay matches the two streams of one round and part and passes each side's frames to the
// other as they come, never holding more than the frame in hand. The frames carry their authors'
// signatures (peer/message_signature.h), so a relay can drop or delay a message but not alter it.
//
// What it carries is capped: at most `bytes_per_s` for all relayed exchanges together, each
// direction an even share (RelayPacer), and at most kRelayedExchangesMax exchanges at once.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "common/mutex.h"
#include "peer/exchange_frame.h"
#include "peer/relay_pacer.h"

namespace starling {

// Exchanges one node relays at once; each holds two of the peer server's threads.
inline constexpr size_t kRelayedExchangesMax = 4;
// The metadata key in which each side names its partner.
inline constexpr const char* kRelayToMetadata = "starling-relay-to";

class ExchangeRelay {
public:
    using SteadyClock = std::chrono::steady_clock;

    // bytes_per_s 0: relays nothing.
    explicit ExchangeRelay(double bytes_per_s) : bytes_per_s_(bytes_per_s), pacer_(bytes_per_s) {}

    // One side's stream, from `caller` for `partner` (both checked by the caller of this): waits
    // until `meet_by` for the partner's stream of the same round and part, then passes this side's
    // frames to the partner's stream until this side ends its writes, and returns once both
    // directions are through. A side whose stream breaks ends the other's as well.
    grpc::Status serve(grpc::ServerContext& context, ExchangeServerStream& stream, uint64_t caller,
                       uint64_t partner, SteadyClock::time_point meet_by);

    // Exchanges whose two sides met here, and the bytes passed on (headers, chunks and the frames'
    // own fields, both directions), since the start.
    uint64_t exchanges_relayed() const { return exchanges_relayed_; }
    uint64_t bytes_relayed() const { return bytes_relayed_; }

    // Ends every relayed stream and wait; later calls fail at once.
    void stop();

private:
    struct Side {
        grpc::ServerContext* context = nullptr;
        ExchangeServerStream* stream = nullptr;
        bool through = false;  // its frames are all passed on, or it broke
    };
    struct Meeting {
        uint64_t first = 0;  // the node whose stream came first: sides[0]
        Side sides[2];
        bool met = false;
        bool broken = false;  // a side's stream ended before its writes did
        int left = 2;         // handlers still in it
    };
    using Key =
        std::tuple<uint64_t, uint64_t, uint64_t, uint32_t>;  // lower id, higher, round, part

    // Passes `from`'s frames, `first` the one already read, to `to`'s stream at its share of the
    // cap; false when either stream broke.
    bool pass_on(Side& from, Side& to, ExchangeWireFrame& first);

    double bytes_per_s_;
    RelayPacer pacer_;
    std::atomic<uint64_t> exchanges_relayed_{0}, bytes_relayed_{0};
    Mutex mutex_;
    std::condition_variable changed_;
    std::map<Key, std::shared_ptr<Meeting>> meetings_ ABSL_GUARDED_BY(mutex_);
    bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace starling
