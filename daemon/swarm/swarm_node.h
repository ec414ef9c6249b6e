// One node of a swarm, as docs/spec.md section 4 runs it: a replica trained locally
// (engine/replica.h: theta, AdamW, its own data stream, phi, outer momentum, residual) and a
// started PeerNode. Every round is H inner steps, then the round's exchange and outer step of
// engine/member_round.h over the PeerNode (daemon/swarm/peer_round_link.h), the code the
// experiment runs in process: a partner for the round, one exchange of messages with it (fused:
// theta under the state codec; split: D and phi), a check of what arrived (MessageSanity), and
// the NoLoCo outer step with the partner's decoded values, or a solo step when there is no
// partner, the exchange failed or the message was refused. Then theta = phi, and a snapshot of
// the state (daemon/swarm/swarm_snapshot.h) is published for joiners.
//
// The node never waits on the swarm beyond the peer layer's deadlines: choosing the partner is
// bounded by pair_timeout, the exchange by its budget (T_xchg and up), after which it goes solo.
// Method "diloco" replaces partner and exchange by an all-gather: every node publishes its D
// message (peer/round_messages.h) and fetches those of every live compatible member, then
// takes DiLoCo's outer step with the mean of every decoded D that arrived (its own decoded from
// what it sent), in node-id order, so nodes that gathered the same messages land on the same bits.
// Method "local" skips partner and exchange: phi = theta after every inner phase.
//
// Overlapped rounds (overlap = true, docs/overlap.md): at the end of round r's inner phase the
// node copies theta to theta_sent and runs round r's partner, exchange and outer step on a thread
// of its own, which touches phi, the outer momentum, the residual and D only, while the round
// thread trains round r + 1 (theta, AdamW, the data) from `start`, where a solo outer step would
// put phi (engine/overlap.h). Between two inner steps the round thread lands the finished
// exchange: theta = phi + (theta - start), the round advances and the
// snapshot of round r + 1's start (counters and data position from when its inner phase began)
// is published. An exchange still running at the end of the next inner phase is waited for: the
// only time training stops.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "daemon/swarm/swarm_snapshot.h"
#include "data/loader.h"
#include "engine/config.h"
#include "engine/evaluator.h"
#include "engine/member_round.h"
#include "engine/replica.h"
#include "kernels/backend.h"
#include "codec/message.h"
#include "daemon/swarm/peer_round_link.h"
#include "peer/peer_node.h"

namespace starling {

// The engine's part (EngineConfig) with method noloco, diloco or local: train.steps is the
// schedule's length in inner steps, train.seed every node's initialisation, and data.node_id is
// ignored (the data order follows the PeerNode's id).
struct SwarmConfig : EngineConfig {
    PeerConfig peer;  // its fingerprint is replaced by the model's
    // Round r's exchange beside round r + 1's inner steps (noloco, diloco; local ignores it).
    // starlingd's configs turn it on; off here, a library user's rounds stay one after the other.
    bool overlap = false;
    // > 0: a time budget for each inner phase (docs/uneven.md): the steps that fit it at the
    // node's own step time (at least 1, at most 16 H; H in the first round), the learning rate of
    // H schedule steps spread over them. 0: the swarm decides from the step times its members say
    // (automatic_round_seconds, peer/round_pacing.h): H steps while the slowest is within
    // uneven_margin of the fastest, else a budget of H times their median. starlingd's configs
    // set a margin; infinite here, a library user's rounds stay H steps.
    double round_seconds = 0.0;
    double uneven_margin = std::numeric_limits<double>::infinity();
    void validate() const;  // throws starling::Error naming the field
};

// How a node's rounds combine, said to its peers: "noloco fused, update sample 8192" (or
// "noloco fused" without one), "noloco split", "diloco" or "local". Nodes that differ cannot
// average each other's messages (a sample of another count is another message), so they are
// never paired.
std::string swarm_method(const SwarmConfig& config);

// What one round did: its exchange and outer step (engine/member_round.h), and its inner phase.
struct SwarmRound : RoundOutcome {
    uint64_t round = 0;
    double train_loss = 0.0;  // mean over the round's inner steps
    double inner_seconds = 0.0;
    uint64_t tokens = 0;  // trained on in the inner phase
    int steps = 0;        // inner steps taken in it
    // Stopped mid inner phase: no outer step, the state is the round's start.
    bool abandoned = false;
    // False when the report is of no landed round: an abandoned phase, and the first overlapped
    // call. An overlapped call's report is otherwise of the round that landed during it, not of
    // the inner phase it trained.
    bool landed = true;
    int overlap_steps = 0;      // inner steps of the next round taken before it landed
    double wait_seconds = 0.0;  // training stopped for it: the round thread waited this long
};

// What a round is doing, for status reports.
enum class RoundPhase { Training, Exchanging };

// A member other than this node, as the service reports it.
struct KnownPeer {
    Member member;
    bool pairable = false;             // one of PeerNode::pairable_ids
    std::optional<double> rtt_ms;      // the last answered direct probe took
    std::optional<MemberScore> score;  // how this node judged its messages
};

// The swarm as this node sees it now: what the service's status, peer list and metrics show.
struct SwarmView {
    Member self;
    std::vector<KnownPeer> others;
    size_t quarantined = 0;  // members this node does not pair with in its current round
    FailureCounts failures;  // the peer layer's (PeerNode::failures)
    ReachabilityVerdict
        reachability;             // whether members can dial this node (PeerNode::reachability)
    size_t anchored_members = 0;  // private members holding a stream to this node
    uint64_t membership_sent_bytes = 0;    // PeerNode::membership_sent_bytes
    uint64_t relayed_bytes = 0;            // PeerNode::relayed_bytes
    uint64_t relayed_exchanges = 0;        // PeerNode::relayed_exchanges
    uint64_t exchanges_through_relay = 0;  // PeerNode::exchanges_through_relay
    uint64_t hole_punches = 0;             // RoundPeers::hole_punches
    uint64_t failed_hole_punches = 0;      // RoundPeers::failed_hole_punches
    uint64_t punched_exchanges = 0;        // RoundPeers::punched_exchanges
    int local_health = 0;                  // PeerNode::local_health
};

// The state at the start of a round: what a checkpoint holds. The snapshot is the one published
// to joiners; the data position is this node's own.
struct RoundStart {
    std::shared_ptr<const Snapshot> snapshot;
    LoaderState data;
};

// Builds a SwarmNode's round link from the one over its PeerNode. A test binary sets one before
// any node is made to run a faulty member (tests/integration/faulty_starlingd.cpp); starlingd
// never does. `replica` outlives the link.
using RoundLinkWrapper = std::function<std::unique_ptr<RoundLink>(
    std::unique_ptr<RoundLink> peer_link, const SwarmConfig& config, Replica& replica)>;
void set_round_link_wrapper(RoundLinkWrapper wrapper);

class SwarmNode {
public:
    // Builds the replica from config.train.seed and starts the peer node.
    explicit SwarmNode(const SwarmConfig& config);
    ~SwarmNode();
    SwarmNode(const SwarmNode&) = delete;
    SwarmNode& operator=(const SwarmNode&) = delete;

    // A fresh node's catch-up: fetches the snapshot most live members hold and adopts it (phi,
    // outer momentum, AdamW state, counters; theta = phi, residual zero). Keeps its own node id,
    // so its own data order. An offer far from the others' and this node's own phi, or one whose
    // bytes are not finite or not what it stated, is refused (daemon/swarm/snapshot_check.h) and
    // its donors are asked last in later copies. Throws starling::Error when no member delivers a
    // valid snapshot this check accepts.
    // on_chunk, if given, is called after every verified chunk (from the fetching threads).
    FetchResult join_from_swarm(std::function<void()> on_chunk = {});
    // Between rounds: lands an exchange in flight, then moves the round on to `round` with the
    // state as it is (theta = phi), the rounds between counted as trained (the inner step, and
    // with it the learning rate, advances H a round, up to the schedule's end), and publishes the
    // new round's snapshot. For a node behind the swarm by no more than a state copy would leave
    // it (service/node_runner.h). No-op unless `round` is ahead of this node's.
    void skip_to_round(uint64_t round);
    // A restart: the state a checkpoint saved (snapshot bytes as published, data position).
    // Throws starling::Error when the bytes do not fit this model; the node is then unchanged.
    void resume(std::span<const std::byte> snapshot, const LoaderState& data);

    // One round. When `stop` turns true during the inner phase the round is abandoned after the
    // current step: no exchange, no outer step, and round_start() stays the round's start.
    // Sequential, the report is this round's. Overlapped, the call trains one inner phase, lands
    // the exchange in flight (between two steps once it has ended, or by waiting at the end),
    // starts this round's exchange and returns the landed round's report (landed false when
    // none was in flight). An abandoned phase returns its own report and leaves an exchange that
    // has not landed in flight, for land_exchange().
    SwarmRound run_round(const std::atomic<bool>& stop);
    SwarmRound run_round() { return run_round(std::atomic<bool>{false}); }
    // Overlapped rounds: waits for the exchange in flight, if any, and lands it (the end of the
    // schedule, a drain, a state copy). Returns its report.
    std::optional<SwarmRound> land_exchange();
    bool exchange_in_flight() const { return in_flight_.has_value(); }
    // Called on the round's thread with the report of every round whose outer step landed, once
    // the snapshot of the next round's start is published: where checkpoints belong.
    void set_round_listener(std::function<void(const SwarmRound&)> listener) {
        round_listener_ = std::move(listener);
    }
    // Called on the round's thread when it moves between training and exchanging, and with
    // Training again at every inner step (progress for the watchdog: service/round_watch.h).
    void set_phase_listener(std::function<void(RoundPhase)> listener) {
        phase_listener_ = std::move(listener);
    }
    // Validation loss of phi (the first eval_batches validation batches, in order); lands an
    // exchange in flight first.
    double evaluate();

    void leave() { peer_->leave(); }  // announces the departure, then stops the peer node
    void kill() { peer_->kill(); }    // stops without a word, as a crash would

    uint64_t node_id() const { return peer_->node_id(); }
    uint64_t round() const { return round_; }
    // How long the next inner phase should take at the last phase's step time; 0 before one.
    double phase_seconds() const { return step_seconds_ * phase_steps(); }
    int64_t inner_step() const { return replica_->inner_step(); }
    bool schedule_done() const { return replica_->inner_step() >= config_.train.steps; }
    const RoundStart& round_start() const { return round_start_; }
    // The peer layer, for tests; the service goes through the calls below.
    PeerNode& peer() { return *peer_; }
    // What the service asks of the peer layer, thread-safe: see PeerNode for each.
    SwarmView view() const;
    const std::string& address() const { return peer_->address(); }
    std::shared_ptr<const Snapshot> latest_snapshot() const { return peer_->snapshots().latest(); }
    void refresh(const std::vector<uint64_t>& node_ids) { peer_->refresh(node_ids); }
    void add_seeds(const std::vector<std::string>& seeds) { peer_->add_seeds(seeds); }
    std::vector<std::string> join_seeds(const std::vector<std::string>& seeds,
                                        SteadyClock::time_point by) {
        return peer_->join_seeds(seeds, by);
    }
    void reload_tls(const TlsConfig& tls) { peer_->reload_tls(tls); }
    void set_serving(bool serving) { peer_->set_serving(serving); }
    // The backend that trains, for status and logs: "cuda:0 (...)" or "cpu (N threads)...".
    const std::string& device() const { return device_; }
    Replica& replica() { return *replica_; }
    // The plan of the round's first message: theta (fused) or D (split).
    const codec::MessagePlan& message_plan() const { return member_round_->message_plan(); }
    // The current state in the snapshot layout: what the next published snapshot would hold.
    // Not while an exchange is in flight (it writes phi and the momentum).
    std::vector<std::byte> snapshot_bytes() const;

private:
    // An overlapped round's exchange, from its start to its landing.
    struct InFlight {
        std::future<void> done;
        SwarmRound report;      // filled by the exchange thread
        SwarmCounters next;     // the next round's start: counters...
        LoaderState next_data;  // ...and data position
        int steps_since = 0;    // inner steps taken since it started
    };

    // The counters of the snapshot at `round`'s start, taken now.
    SwarmCounters counters(uint64_t round) const;
    void publish_snapshot() { publish_snapshot(counters(round_), replica_->data().state()); }
    void publish_snapshot(const SwarmCounters& counters, const LoaderState& data);
    // The current state with `counters`, swarm_snapshot_bytes(n) bytes.
    void pack_snapshot(std::span<std::byte> out, const SwarmCounters& counters) const;
    // Once round_'s outer step is taken and theta set: the round advances to the snapshot of
    // `next` (its start), which is published, and the round is logged and reported.
    void finish_round(const SwarmRound& report, const SwarmCounters& next,
                      const LoaderState& next_data);
    void start_exchange(const SwarmRound& report);
    SwarmRound land();
    // The exchange and outer step of round_ over the peer node, into the report; theta is the
    // round's end.
    void outer_step(SwarmRound& report, std::span<const float> theta);
    void log_round(const SwarmRound& report) const;
    // The next phase's time budget: round_seconds, or the swarm's automatic one; 0: H steps.
    double round_budget() const;
    // Inner steps of the next phase: H, or what fits the budget at the last phase's step time.
    int phase_steps() const;
    // Loads snapshot bytes into the replica (theta = phi, residual zero) and returns the counters.
    SwarmCounters adopt(std::span<const std::byte> bytes);
    void set_phase(RoundPhase phase) {
        if (phase_listener_) phase_listener_(phase);
    }

    SwarmConfig config_;
    Backend backend_;
    std::string device_;
    std::unique_ptr<PeerNode> peer_;
    std::unique_ptr<Replica> replica_;
    LrSchedule schedule_;
    std::unique_ptr<MemberRound> member_round_;
    std::unique_ptr<RoundLink> link_;
    uint64_t round_ = 0;
    RoundStart round_start_;
    // Recycled by publish_snapshot.
    std::vector<std::shared_ptr<std::vector<std::byte>>> snapshot_buffers_;
    // Donors whose snapshots a state copy refused: asked last by the next one.
    std::set<std::string> refused_donors_;
    std::function<void(RoundPhase)> phase_listener_;
    std::function<void(const SwarmRound&)> round_listener_;
    std::unique_ptr<Evaluator> evaluator_;
    // Overlapped rounds: the theta the message in flight is made of, where the phase since started
    // (the solo step's phi) and that step's momentum, which is dropped.
    std::vector<float> theta_sent_, overlap_start_, solo_momentum_;
    double step_seconds_ = 0.0;          // the last whole inner phase's mean step time
    double last_budget_ = 0.0;           // round_budget() at the last phase's start
    std::optional<InFlight> in_flight_;  // last: joined before what its thread uses goes
};

}  // namespace starling
