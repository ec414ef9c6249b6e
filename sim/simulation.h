// The simulation's inner parts, shared by its two halves: membership_sim.cpp (SWIM, churn, the
// event loop) and round_sim.cpp (rounds: phases, pairing, exchanges). Not for use outside sim/.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "peer/pairing.h"
#include "peer/partner_choice.h"
#include "peer/round_pacing.h"
#include "peer/seed_retries.h"
#include "peer/swim.h"
#include "sim/network.h"
#include "sim/swarm_sim.h"

namespace starling::sim::internal {

using std::chrono::duration_cast;
using Seconds = std::chrono::duration<double>;

inline constexpr Time kMeasureEvery = std::chrono::seconds(1);
// What a node's incarnation starts at: its start time in milliseconds, as starlingd's does, from
// a date in 2026, so digests have their real size.
inline constexpr uint64_t kEpochMs = 1'780'000'000'000ull;

inline SteadyClock::time_point clock_at(Time t) {
    return SteadyClock::time_point(duration_cast<SteadyClock::duration>(t));
}

inline Time from_ms(double ms) {
    return duration_cast<Time>(std::chrono::duration<double, std::milli>(ms));
}

inline Time time_of(SteadyClock::time_point t) { return duration_cast<Time>(t.time_since_epoch()); }

inline double seconds(Time t) { return Seconds(t).count(); }

inline size_t varint_bytes(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        ++n;
    }
    return n;
}

enum class Kind : uint8_t {
    Ping,
    Ack,
    PingReq,
    PingReqAnswer,
    Gossip,
    GossipAnswer,
    Join,
    JoinAnswer,
    Leave,
    Pair,
    PairAnswer,
    Exchange,
    StateRequest,
    StateAnswer
};

inline bool is_call(Kind kind) {
    return kind == Kind::Ping || kind == Kind::PingReq || kind == Kind::Gossip ||
           kind == Kind::Join || kind == Kind::Leave || kind == Kind::Pair ||
           kind == Kind::Exchange || kind == Kind::StateRequest;
}

// What a round's messages carry: Pair (round, nonce, mode, digest), PairAnswer (answer), Exchange
// and StateAnswer (round, phi).
struct RoundFields {
    uint64_t round = 0, nonce = 0, digest = 0;
    PairMode mode = PairMode::Random;
    PairAnswer answer;
    double phi = 0;
};

inline bool is_membership(Kind kind) { return kind <= Kind::Leave; }

struct Message {
    Kind kind = Kind::Ping;
    uint32_t from = 0, to = 0;
    uint64_t call = 0;     // the call this message opens or answers
    uint32_t target = 0;   // PingReq: the node to probe
    bool reached = false;  // PingReqAnswer
    std::vector<Member> members;
    RoundFields rounds{};
};

enum class EventType : uint8_t {
    Tick,
    Deliver,
    Timeout,
    RelayTimeout,
    Churn,
    Unfreeze,
    Measure,
    // A node's round thread: its inner phase's end, a pause while choosing, a proposal's deadline,
    // an exchange's. `call` holds the node's round token when scheduled (its choice's token for a
    // pause or a proposal's deadline while choosing): a newer one drops it.
    PhaseEnd,
    Listen,
    PairTimeout,
    ExchangeTimeout,
    PaceCheck  // a node waiting before its next phase looks again
};
enum class ChurnKind : uint8_t { Join, Leave, Crash, Freeze };

struct Event {
    Time at{};
    uint64_t seq = 0;  // ties broken by scheduling order, so the trace is one order
    EventType type = EventType::Tick;
    uint32_t node = 0;
    uint64_t call = 0;  // a Tick's: the node's epoch when it was scheduled
    ChurnKind churn = ChurnKind::Join;
    Message message;
};

struct Later {
    bool operator()(const Event& a, const Event& b) const {
        return a.at != b.at ? a.at > b.at : a.seq > b.seq;
    }
};

enum class Status : uint8_t { Up, Frozen, Crashed, Left };
// What a node's protocol thread waits on, one call at a time as in MembershipProtocol::tick.
enum class Phase : uint8_t { Idle, Joining, Seeding, Direct, Indirect, Gossip };

// A node's round thread (SwarmNode's loop): the inner phase, choosing a partner, the exchange
// (sequential, or with overlap the choice and the exchange in flight beside the next phase, as
// SwarmNode::start_exchange runs them on a thread of their own), and a joiner's state copy first.
enum class Stage : uint8_t { Off, Syncing, Waiting, Training, Landing, Choosing, Exchanging };
// What a node in Stage::Waiting waits for (NodeRunner::pace and wait_for_slower).
enum class Wait : uint8_t { Ahead, Slower };

struct InFlight {
    uint64_t round = 0;
    uint32_t partner = 0;
    double phi_sent = 0;
    bool arrived = false;
    double partner_phi = 0;
};

struct RoundState {
    Stage stage = Stage::Off;
    uint64_t round = 0;
    double step_s = 0;
    double phi = 0;      // the stand-in for the outer weights
    double budget = 0;   // the last phase's time budget (0: H steps)
    double phase_s = 0;  // the last phase's length
    Wait wait = Wait::Ahead;
    Time wait_until{};
    SlowerWait slower;  // the members a Wait::Slower waits for, and which of them it asks next
    // What the last state copy cost in rounds (the swarm's median moved on meanwhile), and the
    // median when the copy in progress began.
    std::optional<uint64_t> copy_cost, median_before_copy;
    std::unique_ptr<PairingBook> book;
    std::optional<PartnerChoice> choice;
    uint64_t nonce = 0;
    uint64_t view_digest = 0;  // of the pairable view the choice began with
    // Round tokens (see EventType::PhaseEnd), one counter for both so they never collide: the
    // round thread's, and its choice's, which runs beside the next phase with overlap.
    uint64_t next_token = 0, token = 0, choice_token = 0;
    bool choosing = false;  // a choice of a partner is under way, for choice_round
    uint64_t choice_round = 0;
    bool proposing = false;  // a Pair of ours is out (call: pair_call)
    uint64_t pair_call = 0;
    bool crossed = false;  // our proposal lost the tiebreak: waiting for theirs
    std::optional<InFlight> exchange;
    // Exchange messages that came before this node expected them: round -> (from, phi).
    std::map<uint64_t, std::pair<uint32_t, double>> inbox;
    int choices_since_join = -1;  // a joiner's choices until its first pairing (-1: none pending)
    Time last_choice{-1};         // when the last choice ended (-1: none yet)
    Time choice_start{-1};        // when the last began (-1: none yet)
    Time wait_start{};
    std::vector<Event> deferred;  // round timers that came while the node was frozen
};

struct Node {
    uint64_t id = 0;
    std::unique_ptr<SwimCore> core;
    std::unique_ptr<SeedRetries> seeds;
    Status status = Status::Up;
    bool slow = false;
    bool unreachable = false;  // nobody can dial it (NetworkConfig::private_share)
    bool joined = true;        // a joiner's first Join answered
    Phase phase = Phase::Idle;
    uint64_t call = 0;
    // Raised by a freeze, so the ticks scheduled before it are dropped: one chain of periods.
    uint64_t epoch = 0;
    Time thawed{-1};  // when its last freeze ended
    Time period_start{};
    std::vector<std::string> seeds_due;  // this period's, dialled one after another
    std::string seed;                    // the one being dialled
    std::optional<Member> probe_next;    // this period's probe, once the seeds are done
    Member probe_target;
    Time probe_sent{};
    uint64_t direct_call = 0;  // the direct ping, still open during the indirect probes
    bool direct_open = false;
    std::chrono::milliseconds probe_timeout{};  // this probe's (SwimCore::probe_timeout_for)
    std::optional<Member> gossip_target;
    size_t indirect_waiting = 0;
    bool indirect_reached = false;
    Time upload_free{};
    RoundState rounds;
};

// A helper's indirect probe: its own ping of the target, answered back to the asking node.
struct Relay {
    uint32_t helper = 0, origin = 0;
    uint64_t origin_call = 0;
};

struct PendingJoin {
    uint32_t node;
    Time since;
};

struct PendingCrash {
    uint32_t node;
    Time at;
    bool suspected = false;
};

class Simulation {
public:
    explicit Simulation(const SimConfig& config)
        : config_(config),
          network_(config.network, config.seed),
          rng_(mix64(config.seed)),
          end_(duration_cast<Time>(Seconds(config.seconds))),
          warmup_(duration_cast<Time>(Seconds(config.warmup_s))) {}

    Figures run();

private:
    uint32_t add_node(Time now);
    std::map<uint64_t, size_t> anchored_;  // per anchor, the private nodes holding a stream to it
    void schedule(Event event);
    void schedule_at(Time at, EventType type, uint32_t node, uint64_t call = 0);
    void schedule_churn(ChurnKind kind, Time now);
    double churn_rate(ChurnKind kind) const;
    // Whether the network lets the message reach its node: not a call to a private node, unless
    // it is an exchange that node opened.
    bool reaches(const Message& message) const;
    // The anchor a proposal to a private node goes through (RoundPeers::relay_pair): the first
    // of its anchors that is up, when the proposer is callable.
    std::optional<uint32_t> relay_anchor(const Message& message) const;
    // The private members the deterministic matching pairs around: the table's, or none when
    // the study switches the preference for direct pairs off (NetworkConfig::direct_first).
    std::vector<uint64_t> unreachable_in_matching(const MemberTable& table) const;
    void send(Message message, Time now);
    void record(const Event& event);

    void tick(uint32_t n, Time now);
    void next_seed(uint32_t n, Time now);
    void start_probe(uint32_t n, Time now);
    // Indirect probes of the period's target, the direct ping still open or never sent.
    void start_indirect(uint32_t n, Time now);
    // A private node's anchors (peer/anchors.h), chosen again when one of them is no longer alive;
    // a node that holds kAnchorStreamsMax streams turns more away, as AnchorHub does.
    void hold_anchors(uint32_t n);
    // A private node that went lets go of its anchors' streams.
    void release_anchors(uint32_t n);
    void start_gossip(uint32_t n, Time now);
    void finish_period(uint32_t n, Time now);
    void conclude_indirect(uint32_t n, Time now);
    void handle(Message& message, Time now);
    void timeout(uint32_t n, uint64_t call, Time now);
    void relay_timeout(uint64_t call, Time now);
    void churn(ChurnKind kind, Time now);
    void start_join(uint32_t n, Time now);
    void measure(Time now);

    // Rounds (round_sim.cpp).
    void start_rounds(uint32_t n, Time now, uint64_t round, double phi);
    void start_phase(uint32_t n, Time now);
    void phase_end(uint32_t n, Time now);
    void choose(uint32_t n, Time now);
    void drive(uint32_t n, Time now);
    void end_proposal(uint32_t n, bool accepted, bool ask_again, Time now);
    void finish_choice(uint32_t n, Time now);
    void land(uint32_t n, Time now);
    void handle_round(Message& message, Time now);
    void answer_pair(const Message& message, Time now);
    void request_state(uint32_t n, Time now);
    std::vector<PairingFacts> heard_others(uint32_t n, Time now) const;
    void next_round(uint32_t n, Time now);
    void adopt_state(uint32_t n, uint64_t round, double phi, Time now);
    void wait_or_train(uint32_t n, Time now);
    void pace_check(uint32_t n, Time now);
    void answer_state(const Message& message, Time now);
    void round_timer(const Event& event, Time now);
    void schedule_round(uint32_t n, Time at, EventType type);
    void schedule_choice(uint32_t n, Time at, EventType type);
    void drop_choice(uint32_t n);
    void record_phi(uint64_t round, double phi);
    void finish_round_figures();
    std::optional<uint32_t> random_up(std::optional<uint32_t> except = std::nullopt);
    double alive_view_share() const;

    size_t digest_bytes(const Member& member);
    size_t message_bytes(const Message& message);
    // A pacing refresh of `member`: a Ping and its answer, the member's digest.
    void count_refresh(const Node& member, Time now);

    const SimConfig& config_;
    Network network_;
    std::mt19937_64 rng_;
    const Time end_, warmup_;
    std::vector<Event> queue_;
    uint64_t seq_ = 0;
    uint64_t next_call_ = 1;
    std::vector<Node> nodes_;
    std::unordered_map<uint64_t, uint32_t> index_of_;
    std::unordered_map<std::string, uint32_t> index_of_address_;
    std::unordered_map<uint64_t, Relay> relays_;
    std::unordered_map<uint64_t, std::pair<uint64_t, size_t>> digest_size_;  // id -> (key, bytes)
    std::vector<PendingJoin> joins_;
    std::vector<PendingCrash> crashes_;
    std::vector<double> join_known_, crash_suspected_, crash_known_;
    Figures figures_;
    double payload_bytes_ = 0, calls_ = 0;
    // Per round: the count, sum and sum of squares of phi over the nodes that reached it.
    struct PhiSums {
        double count = 0, sum = 0, squares = 0;
    };
    std::vector<PhiSums> phi_sums_;
    std::vector<double> first_pair_rounds_, round_seconds_, choice_seconds_, wait_seconds_;
};

}  // namespace starling::sim::internal
