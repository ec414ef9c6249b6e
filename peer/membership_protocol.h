// SWIM membership over gRPC: bootstrap from seeds and a cache of last-known peers, push-pull
// gossip of member digests, failure detection (direct probe, indirect probe through k members,
// suspicion, death), graceful leave, and the server's side of each of those calls: the gRPC adapter
// of SwimCore (peer/swim.h), which owns the member table and decides whom to probe, whom to ask
// and what to gossip. The round's part (peer/round_peers.h) reads the table and notes rounds in
// it. PeerNode runs tick() on its protocol thread, one every gossip interval.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/support/status.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/throttle.h"
#include "peer/anchor_hub.h"
#include "peer/auth.h"
#include "peer/failure_tally.h"
#include "peer/membership.h"
#include "peer/peer_channels.h"
#include "peer/peer_config.h"
#include "peer/seed_retries.h"
#include "peer/swim.h"
#include "starling/v1/peer.pb.h"

namespace starling {

class MembershipProtocol {
public:
    // self: this node's digest; its address is set once the port is known (set_address).
    // anchors: the streams private members hold to this node, over which pings of them go.
    MembershipProtocol(const PeerConfig& config, Member self, SwarmAuth& auth,
                       PeerChannels& channels, FailureTally& failures, AnchorHub& anchors);

    MemberTable& table() { return swim_.table(); }
    const MemberTable& table() const { return swim_.table(); }
    void set_address(const std::string& address);

    // The start's joins: through each of `seeds` and the cached peers in turn until one joins
    // this node. Throws starling::Error when a seed says another live node holds this node's id.
    void join_first(const std::vector<std::string>& seeds);
    // One protocol period: expiries, seeds due again, a probe, a gossip, the peer cache.
    void tick();
    // Announces LEFT to every reachable member, at once, each within a probe timeout.
    void announce_leave();

    // See PeerNode for each.
    void add_seeds(const std::vector<std::string>& seeds);
    std::vector<std::string> join_seeds(const std::vector<std::string>& seeds,
                                        SteadyClock::time_point by);
    void refresh(const std::vector<uint64_t>& node_ids);
    std::optional<double> round_trip_ms(uint64_t node_id) const;
    // Members' and seeds' addresses: the connections worth keeping.
    std::set<std::string> addresses_in_use() const;
    // Payload bytes of the membership calls this node made and the answers it gave (Join, Ping,
    // PingReq, Gossip, Leave: the protobuf messages, without gRPC's framing), since it started:
    // what the simulator counts as membership payload.
    uint64_t sent_bytes() const { return sent_bytes_.load(std::memory_order_relaxed); }
    // SwimCore::local_health: 0 on a healthy node, up to 8 on one whose own timeouts fire.
    int local_health() const { return swim_.local_health(); }

    // The server's side of the membership calls, for a caller whose proof was checked.
    grpc::Status answer_join(uint64_t caller, const v1::JoinRequest& request,
                             v1::JoinResponse* response);
    grpc::Status answer_gossip(const v1::GossipRequest& request, v1::GossipResponse* response);
    grpc::Status answer_ping(const v1::PingRequest& request, v1::PingResponse* response);
    grpc::Status answer_ping_req(const v1::PingReqRequest& request, v1::PingReqResponse* response);
    grpc::Status answer_leave(uint64_t caller, const v1::LeaveRequest& request);

private:
    // Self: the seed's address is this node's own (a name that covers every member, say).
    enum class JoinResult { Joined, Unreachable, Duplicate, Self };

    // Each address of the seed gets 4 probe timeouts, or what is left before `by` when less.
    JoinResult try_join(const std::string& seed, std::string* why,
                        SteadyClock::time_point by = SteadyClock::time_point::max());
    JoinResult join_through(const std::string& seed, const std::shared_ptr<grpc::Channel>& channel,
                            std::string* why, SteadyClock::time_point by);
    // At `address`, or over the target's Anchor stream when it holds one to this node.
    std::optional<Member> ping(const std::string& address, uint64_t target_id);
    std::optional<Member> ping(const std::string& address, uint64_t target_id,
                               std::chrono::milliseconds timeout);
    // A direct probe, then indirect ones through the core's helpers: whether any reached it.
    bool probe(const Member& target);
    void gossip_with(const Member& target);
    std::optional<std::string> duplicate_of(const Member& joiner);
    void maintain_seeds(SteadyClock::time_point now);
    void save_peer_cache();
    // Forgets the round-trip times of former members.
    void forget_departed();
    void count_sent(const google::protobuf::MessageLite& message);

    const PeerConfig& config_;
    SwarmAuth& auth_;
    PeerChannels& channels_;
    FailureTally& failures_;
    AnchorHub& anchors_;
    SwimCore swim_;        // the member table and every decision of the protocol
    std::string address_;  // set before the server answers and the protocol thread starts

    mutable Mutex rtt_mutex_;
    std::map<uint64_t, double> rtt_ms_ ABSL_GUARDED_BY(rtt_mutex_);
    SeedRetries seeds_;

    // The protocol thread's: the addresses in peers.txt, and when it may write them again.
    static constexpr std::chrono::seconds kPeerCacheInterval{30};
    std::vector<std::string> cached_addresses_;
    Throttle peer_cache_writes_{kPeerCacheInterval};
    std::atomic<uint64_t> sent_bytes_{0};
};

}  // namespace starling
