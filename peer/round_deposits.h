// DiLoCo's round messages of members that cannot be dialed (docs/nat.md). Every member fetches
// every other's message of the round (peer/round_messages.h), but nobody can call a private
// member, so it deposits its message with its anchors, the members it holds a stream to
// (peer/anchors.h), and the others fetch it from them. The author's signature covers the message,
// its round and its tokens, so an anchor can pass it on but not alter it: the anchor checks the
// signature before it holds a deposit, and every fetcher checks it again.
//
// What an anchor carries for others is capped: it holds at most `limit_bytes` of deposits at once
// (PeerConfig::relay_limit_mib), each anchored member at most an even share of it, and a deposit
// past its author's share is refused. Every member fetches a deposit once a round, so the bytes an
// anchor serves are bounded by what it holds times the swarm's size.
#pragma once

#include <grpcpp/support/status.h>
#include <grpcpp/support/sync_stream.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "common/mutex.h"
#include "peer/identity.h"
#include "peer/round_messages.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {

// The anchor's side: the deposits of the members anchored here.
class RoundDeposits {
public:
    explicit RoundDeposits(uint64_t limit_bytes) : limit_bytes_(limit_bytes) {}

    // Reads `author`'s deposit of one round's message, whole and signed under `author_key`, and
    // holds it (its last two rounds) in place of its older ones. `anchored`: how many members
    // hold a stream to this node, whose shares of the limit are even. RESOURCE_EXHAUSTED past the
    // author's share, INVALID_ARGUMENT when the deposit is malformed or not the author's; fetches
    // of a round refused end at once with NOT_FOUND.
    grpc::Status accept(uint64_t author, const PublicKey& author_key, size_t anchored,
                        grpc::ServerReader<v1::DepositRoundMessageFrame>& reader);
    // `author`'s message of `round`, frame by frame as the author would serve it, once deposited
    // (waiting until `deadline`). `anchored_here`: whether the author holds a stream to this node,
    // which a deposit may yet come over; NOT_FOUND when neither it nor a deposit of it is here.
    grpc::Status serve(uint64_t author, bool anchored_here, uint64_t round,
                       SteadyClock::time_point deadline,
                       grpc::ServerWriter<v1::RoundMessageFrame>& writer);
    // Drops the deposits of members that no longer hold a stream here.
    void keep_only(const std::function<bool(uint64_t)>& anchored_here);
    // Waits end at once; later deposits are refused.
    void stop();

    uint64_t bytes_held() const;
    // Deposit bytes taken in and served to fetchers, since the start.
    uint64_t bytes_relayed() const { return bytes_relayed_; }

private:
    struct Held {
        RoundMessageBoard board;
        std::map<uint64_t, uint64_t> bytes_by_round;  // the rounds the board keeps
    };
    std::shared_ptr<Held> held_of(uint64_t author, bool create);
    // What `held` keeps of `round` from now on: `bytes`, or 0 for a deposit refused.
    void record(Held& held, uint64_t round, uint64_t bytes);

    const uint64_t limit_bytes_;
    std::atomic<uint64_t> bytes_relayed_{0};
    mutable Mutex mutex_;
    std::map<uint64_t, std::shared_ptr<Held>> held_ ABSL_GUARDED_BY(mutex_);
    bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
};

// The private member's side: deposits its signed message of `round` with the anchor `stub` calls.
// "" when the anchor holds it, else why not.
std::string deposit_round_message(v1::Peer::Stub& stub, grpc::ClientContext& context,
                                  uint64_t round, const RoundMessage& message);

}  // namespace starling
