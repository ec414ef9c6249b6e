// The private member's side of peer/anchors.h: the Anchor streams it holds open to its anchors,
// each on a thread of its own that answers the pings coming down it. The protocol thread calls
// maintain() once a period; the anchors whose streams are held go in this node's digest.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "peer/auth.h"
#include "peer/membership.h"
#include "peer/peer_channels.h"
#include "starling/v1/peer.pb.h"

namespace starling {

class AnchorLinks {
public:
    // What this node answers a ping with (MembershipProtocol::answer_ping), and a relayed
    // proposal (RoundPeers::answer_pair).
    using Answer = std::function<void(const v1::PingRequest&, v1::PingResponse*)>;
    using AnswerPair =
        std::function<void(uint64_t proposer, const v1::PairRequest&, v1::PairResponse*)>;
    using RoundTrip = std::function<std::optional<double>(uint64_t)>;
    // An anchor that turned this node away, or whose stream ended before it was held, is not
    // asked again for this long.
    static constexpr std::chrono::seconds kRefusedFor{60};

    AnchorLinks(MemberTable& table, PeerChannels& channels, const SwarmAuth& auth,
                RoundTrip round_trip_ms, Answer answer, AnswerPair answer_pair);
    ~AnchorLinks();  // stop()
    AnchorLinks(const AnchorLinks&) = delete;
    AnchorLinks& operator=(const AnchorLinks&) = delete;

    // Streams to the anchors choose_anchors names while `is_private`, to none otherwise; this
    // node's digest then names those held. Opens and cancels streams, never waits on one.
    void maintain(bool is_private);
    // Ends every stream and waits for their threads.
    void stop();

private:
    struct Link {
        grpc::ClientContext context;
        std::atomic<bool> held{false}, ended{false};
        grpc::Status status;
        std::thread thread;
    };
    void run(Link& link, const std::string& address);
    // Joins the threads of streams that ended and notes the anchors that would not hold one.
    void reap(SteadyClock::time_point now);
    void drop(uint64_t anchor);

    MemberTable& table_;
    PeerChannels& channels_;
    const SwarmAuth& auth_;
    const RoundTrip round_trip_ms_;
    const Answer answer_;
    const AnswerPair answer_pair_;
    // The protocol thread's alone.
    std::map<uint64_t, std::unique_ptr<Link>> links_;
    std::map<uint64_t, SteadyClock::time_point> refused_until_;
};

}  // namespace starling
