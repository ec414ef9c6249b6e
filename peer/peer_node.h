// One swarm member's peer layer: the peer port (a gRPC server for the Peer and StateSync
// services behind a ConnectionGate) and the objects that play each role, which it owns:
// MembershipProtocol (joining, SWIM probes and gossip, leaving; the member table), AnchorHub and
// AnchorLinks (the streams through which a private member is probed, peer/anchors.h), RoundPeers
// (pairing, exchanges, DiLoCo's round messages, the advertised round), PeerStateSync (snapshots
// served and copied) and PeerChannels (connections to others, TLS). One thread runs the
// membership protocol, one tick every gossip interval; the gRPC server answers on its own
// threads and hands each call to the role it belongs to.
#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "peer/anchor_hub.h"
#include "peer/anchor_links.h"
#include "peer/auth.h"
#include "peer/connection_gate.h"
#include "peer/failure_tally.h"
#include "peer/identity.h"
#include "peer/membership_protocol.h"
#include "peer/peer_channels.h"
#include "peer/peer_config.h"
#include "peer/peer_state_sync.h"
#include "peer/reachability_watch.h"
#include "peer/round_peers.h"

namespace starling {

// What a seed says to an authenticated Ping from a throwaway identity (`starling check`): its
// member digest when it accepted this config's swarm secret (or TLS credentials), else why not,
// in its words.
struct SeedAnswer {
    std::optional<Member> member;
    std::string problem;  // when member is empty
};
SeedAnswer ask_seed(const PeerConfig& config, const std::string& seed,
                    std::chrono::milliseconds timeout);
// Asks a seed, from a throwaway identity, to dial `address` back; the nonce is awaited at `inbox`
// (`starling check`, whose own listener feeds it).
DialBackResult ask_seed_to_dial_back(const PeerConfig& config, const std::string& seed,
                                     const std::string& address, DialBackInbox& inbox);

class PeerNode {
public:
    explicit PeerNode(const PeerConfig& config);
    PeerNode(PeerConfig config, NodeIdentity identity);
    ~PeerNode();  // stops like kill() if still running
    PeerNode(const PeerNode&) = delete;
    PeerNode& operator=(const PeerNode&) = delete;

    // Binds, joins through the seeds (and cached peers), starts the protocol thread. When no seed
    // answers the node starts alone and keeps retrying with backoff. Throws starling::Error when
    // it cannot listen, when its announce address cannot work, or when another live node already
    // holds its node id.
    void start();
    // Announces LEFT to every reachable member, then stops.
    void leave();
    // What the standard gRPC health service on the peer port reports (when it is enabled): a
    // draining node says NOT_SERVING, so load balancers and probes stop sending to it.
    void set_serving(bool serving);
    // Stops at once without a word: what peers see when a node crashes.
    void kill();

    uint64_t node_id() const { return identity_.node_id(); }
    const std::string& address() const { return address_; }

    // Membership (peer/membership_protocol.h), from start() on.
    std::vector<Member> members() const { return membership_->table().all(); }
    std::vector<uint64_t> pairable_ids() const { return membership_->table().pairable_ids(); }
    // This node's mean inner step time, said in its digests; and what the pairable members said.
    void set_step_seconds(double seconds) { membership_->table().set_step_seconds(seconds); }
    std::vector<double> pairable_step_seconds() const {
        return membership_->table().pairable_step_seconds();
    }
    // Pings each of these members at once and merges the digests they answer with: their round
    // as of now, where gossip takes some intervals to carry it (a private member only when this
    // node is its anchor: nobody else can reach it). Returns within the probe timeout.
    void refresh(const std::vector<uint64_t>& node_ids) { membership_->refresh(node_ids); }
    // Milliseconds the last answered direct probe of a member took; nullopt before one.
    std::optional<double> round_trip_ms(uint64_t node_id) const {
        return membership_->round_trip_ms(node_id);
    }
    // More addresses to join through (a reloaded config's); tried on the next tick.
    void add_seeds(const std::vector<std::string>& seeds) { membership_->add_seeds(seeds); }
    // More addresses to join through now (`starling join HOST:PORT`): each is dialled at once, all
    // of them together, each address within 4 probe timeouts and all before `by`. One that
    // answers is kept as a seed (tried again like the config's); one that does not is logged at
    // warn and not kept. Returns per seed, in order, "" when the node joined through it, else why
    // not.
    std::vector<std::string> join_seeds(const std::vector<std::string>& seeds,
                                        SteadyClock::time_point by) {
        return membership_->join_seeds(seeds, by);
    }

    // The round's part (peer/round_peers.h): pairing, exchanges, round messages, judgements, and
    // the round this node advertises. From start() on.
    RoundPeers& rounds() { return *rounds_; }
    const RoundPeers& rounds() const { return *rounds_; }

    // What this node serves to joiners (peer/state_sync.h): the daemon publishes its snapshots
    // here.
    SnapshotStore& snapshots() { return state_sync_.snapshots(); }
    // A joiner's catch-up: fetches the snapshot most live compatible members hold, from all of
    // them at once, into destination. Throws starling::Error when no member can deliver one.
    FetchResult fetch_state(const SnapshotExpectation& expected, std::span<std::byte> destination,
                            const FetchOptions& options = {});

    // Whether members can dial this node's announced address, and what showed it
    // (peer/reachability_watch.h); Unknown before start() and until members answered.
    ReachabilityVerdict reachability() const {
        return reachability_ ? reachability_->verdict() : ReachabilityVerdict{};
    }

    // The anchors this node holds a stream to while private (peer/anchors.h), as its digest
    // names them; the private members that hold one to this node; and the pings of them and
    // proposals to them sent down those streams that were answered.
    std::vector<uint64_t> anchors() const { return membership_->table().self().anchors; }
    size_t anchored_members() const { return anchor_hub_.streams(); }
    // MembershipProtocol::sent_bytes, from start() on.
    uint64_t membership_sent_bytes() const { return membership_->sent_bytes(); }
    int local_health() const { return membership_->local_health(); }
    uint64_t anchor_pings() const { return anchor_hub_.pings_answered(); }
    uint64_t relayed_proposals() const { return anchor_hub_.proposals_relayed(); }
    // Bytes this node carried for private members, from start() on: as their anchor, their DiLoCo
    // messages taken in and served (peer/round_deposits.h), and as a relay, their exchanges passed
    // on (peer/exchange_relay.h).
    uint64_t relayed_bytes() const {
        return rounds_ ? rounds_->relayed_bytes() + rounds_->relayed_exchange_bytes() : 0;
    }
    // Exchanges between two private members this node relayed, and this node's own exchanges that
    // went through a relay, from start() on.
    uint64_t relayed_exchanges() const { return rounds_ ? rounds_->relayed_exchanges() : 0; }
    uint64_t exchanges_through_relay() const {
        return rounds_ ? rounds_->exchanges_through_relay() : 0;
    }

    // Connections this node keeps to other nodes (membership and exchange ones counted apart).
    size_t open_channels() const { return channels_.size(); }
    // Puts the TLS files at `tls`'s paths in use for connections made from now on
    // (PeerChannels::reload_tls); throws starling::Error naming the problem.
    void reload_tls(const TlsConfig& tls) { channels_.reload_tls(tls); }
    // What went wrong in the peer layer since the start, by reason (peer/failure_tally.h):
    // others' calls this node refused for failed authentication, connections closed before they
    // authenticated, this node's joins a seed refused, exchanges, pairing calls and round-message
    // fetches cut off by their deadlines, partners' messages malformed or mismatched. The daemon
    // keeps its own tally of what its round loop meets (NodeState::failures).
    FailureCounts failures() const;

private:
    class Service;

    void run();
    // One protocol period: membership's, then connections and link rates of departed members
    // are let go, so a long-lived node in a swarm with churn does not keep one for every peer it
    // ever met.
    void tick();
    void stop(bool announce);

    PeerConfig config_;
    NodeIdentity identity_;
    SwarmAuth auth_;
    PeerChannels channels_;
    PeerStateSync state_sync_;
    FailureTally failures_;  // all but the refusals auth_ counts itself
    std::string address_;
    AnchorHub anchor_hub_;  // streams private members hold to this node (peer/anchors.h)
    std::unique_ptr<MembershipProtocol> membership_;
    std::unique_ptr<RoundPeers> rounds_;
    std::unique_ptr<ReachabilityWatch> reachability_;
    std::unique_ptr<AnchorLinks> anchor_links_;  // this node's own, while it is private
    std::unique_ptr<Service> service_;
    uint64_t tls_failures_before_ = 0;      // the process's failed TLS handshakes when it started
    std::unique_ptr<ConnectionGate> gate_;  // the peer port's accept loop, in front of server_
    std::unique_ptr<grpc::Server> server_;

    Mutex run_mutex_;
    std::condition_variable wake_;
    bool stopping_ ABSL_GUARDED_BY(run_mutex_) = false;
    std::atomic<bool> running_{false};
    std::thread thread_;
};

}  // namespace starling
