// What starlingd knows about itself, for the Control API (daemon/service/control_service.h) and
// systemd's STATUS line: the round loop records into it, the Control threads read it. Live
// values (peers, uptime, checkpoint age) are filled in when a status is asked for. It is the one
// place the round loop records to: every record also goes to /metrics (NodeMetrics) when given.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "common/mutex.h"
#include "daemon/service/metrics.h"
#include "daemon/swarm/swarm_node.h"
#include "peer/failure_tally.h"
#include "starling/v1/control.pb.h"

namespace starling {

class NodeState {
public:
    // The fixed facts: node id, swarm, address, method, model, device, schedule length. metrics,
    // when not null, must outlive this object.
    explicit NodeState(v1::NodeStatus identity, NodeMetrics* metrics = nullptr);

    void set_phase(v1::NodePhase phase);
    v1::NodePhase phase() const;
    using Clock = std::chrono::steady_clock;
    // A finished round: its report, the node's round and inner step after it, the bytes of the
    // fp32 weights (for the compression ratio), and when it ended (for the ETA).
    void record_round(const SwarmRound& round, uint64_t next_round, int64_t inner_step,
                      uint64_t weight_bytes, Clock::time_point ended = Clock::now());
    // The round and inner step after a resume or a catch-up from the swarm, reached at `now`: the
    // next round's pace is measured from here, and the pace of the rounds before is kept.
    void set_position(uint64_t round, int64_t inner_step, Clock::time_point now = Clock::now());
    void record_val_loss(double loss);
    void record_checkpoint(uint64_t round);
    // A checkpoint that could not be written: last_failure says so until one is written again.
    void record_checkpoint_failure(const std::string& why);
    // A state copy from the swarm that failed.
    void record_state_copy_failure() { failures_.count(FailureReason::StateSync); }
    // The node's failures by reason: the peer layer's (SwarmView::failures: refused calls,
    // deadlines, malformed or mismatched messages) plus the round loop's own, recorded here:
    // messages the outer step refused (each round's `refused`), state copies, checkpoints.
    FailureCounts failures(const FailureCounts& peer_layer) const;
    // Forgets the exchange history of partners that are no longer members, so a long-lived node
    // in a swarm with churn does not keep one entry per node it ever met.
    void forget_departed(const SwarmView& swarm);

    v1::NodeStatus status(const SwarmView& swarm) const;
    // The fields of the status that need no peer layer: everything recorded, uptime, ETA.
    v1::NodeStatus recorded(Clock::time_point now = Clock::now()) const;
    v1::ListPeersResponse peers(const SwarmView& swarm) const;
    // One line for systemd's STATUS and the logs: round, phase, loss, peers.
    std::string summary(const SwarmView& swarm) const;

private:
    static constexpr size_t kRecentRounds = 60;  // losses kept for the trend
    static constexpr size_t kPaceRounds = 10;    // rounds the ETA's pace is measured over
    struct Exchanges {
        uint64_t count = 0;
        Clock::time_point last{};
    };

    NodeMetrics* metrics_;
    FailureTally failures_;  // the round loop's own
    mutable Mutex mutex_;
    v1::NodeStatus status_ ABSL_GUARDED_BY(mutex_);
    const Clock::time_point started_ = Clock::now();
    std::optional<Clock::time_point> checkpointed_ ABSL_GUARDED_BY(mutex_);
    // Since the last checkpoint written.
    std::string checkpoint_failure_ ABSL_GUARDED_BY(mutex_);
    // By partner id; only members still listed are reported.
    std::map<uint64_t, Exchanges> exchanges_ ABSL_GUARDED_BY(mutex_);
    std::deque<double> recent_losses_ ABSL_GUARDED_BY(mutex_);
    // Seconds and steps of each of the last rounds. A jump in position (a state copy, a skip)
    // starts the next interval at the jump, so the pace measured before it is kept.
    std::deque<std::pair<double, int64_t>> paces_ ABSL_GUARDED_BY(mutex_);
    // When the last round ended or the position jumped, at which step.
    std::optional<std::pair<Clock::time_point, int64_t>> last_end_ ABSL_GUARDED_BY(mutex_);
};

std::string_view node_phase_name(v1::NodePhase phase);  // "training", "exchanging", ...

}  // namespace starling
