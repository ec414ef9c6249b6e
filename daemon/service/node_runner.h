// starlingd's round loop around a SwarmNode, with the policy a long-lived node needs:
// - start: resume from the newest checkpoint in <data_dir>/checkpoints; without one, and with
//   seeds, wait up to join_timeout_s for a compatible member and copy the swarm's state from it
//   (a snapshot: phi, outer momentum, AdamW state, counters) unless the swarm is at round 0.
// - catch up: when the median round of the compatible members is more than max_round_gap ahead,
//   the node can never pair again, so it adopts a snapshot from the swarm (a late joiner, a node
//   restarted from an old checkpoint, one added with `starling join`). A copy that lands still
//   more than max_round_gap behind (a link too slow to copy the state within that many rounds)
//   takes the swarm's median round for the state it copied, rather than copying forever; and once
//   a copy has shown what it costs (the rounds the swarm moved on meanwhile), a node no further
//   behind than that goes on from the median round with its own state, which is no older than a
//   copy's would be by the time it landed.
// - pace: when this node is ahead of every compatible member by more than max_round_gap, it waits
//   (at most pace_timeout_s per round) for one to come within reach, instead of running on alone;
//   with NoLoCo it also waits (at most one of its own inner phases) for a member one round behind.
// - checkpoint once checkpoint_every rounds have passed since the last checkpoint (a failed one is
//   retried the next round and shows in status and /metrics), evaluate phi every eval_every rounds.
// - done: once the schedule's steps are all taken, a last checkpoint, and the node stays up
//   serving its state until stopped.
// - drain (SIGTERM, SIGINT, `starling leave`): an inner phase in progress is abandoned after its
//   current step, an exchange by its budget; then a checkpoint of the round's start,
//   a Leave announced to the swarm, and run() returns.
// - overlap ([swarm].overlap): a round's outer step lands between two inner steps of the next
//   round, and its evaluation and checkpoint happen there; the end of the schedule, a drain and a
//   state copy wait for the exchange in flight and land it first.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <optional>

#include "common/mutex.h"
#include "common/throttle.h"
#include "daemon/service/metrics.h"
#include "daemon/service/node_state.h"
#include "daemon/service/round_watch.h"
#include "daemon/swarm/node_config.h"
#include "daemon/swarm/swarm_node.h"
#include "peer/round_pacing.h"

namespace starling {

// Whether a node now at `round` writes a checkpoint: `every` rounds or more since the last one
// (since round 0 when there is none). Counting rounds elapsed rather than testing round % every
// keeps a state copy that jumps the round from skipping checkpoints. every 0: never.
bool checkpoint_due(uint64_t round, std::optional<uint64_t> last_checkpoint, int every);

class NodeRunner {
public:
    // Builds the node (binds the peer port, loads or creates the identity) and loads the newest
    // checkpoint. Throws starling::Error naming what is wrong. metrics may be null.
    NodeRunner(const NodeConfig& config, const std::string& version, NodeMetrics* metrics);
    ~NodeRunner();

    // The round loop, on the calling thread, until the drain has finished.
    void run();
    // Thread-safe; returns at once.
    void request_drain();
    bool draining() const { return drain_.load(); }
    // Settings SIGHUP may change: checkpoint cadence, log level, new seeds, and the TLS files (read
    // again and put in use once checked; throws starling::Error naming the problem otherwise).
    void reload(const NodeConfig& config);
    // [node].training_nice: the calling thread, and those it starts, `by` nicer (at most 19);
    // a warning when the system refuses.
    static void lower_this_thread_priority(int by);
    void add_seeds(const std::vector<std::string>& seeds) { node_->add_seeds(seeds); }

    NodeState& state() { return *state_; }
    // The round loop's progress, for systemd's watchdog.
    const RoundWatch& round_watch() const { return watch_; }
    SwarmNode& node() { return *node_; }

private:
    // Compatible ALIVE members other than this node.
    std::vector<PairingFacts> compatible_others() const;
    // Those of them heard from within an inner phase of this node's (heard_lately): what NoLoCo's
    // pacing reads, as a large swarm's gossip brings others' rounds late.
    std::vector<PairingFacts> heard_others() const;
    // A first start with seeds: waits for a member, then copies the swarm's state unless the
    // swarm is still at round 0 (whose weights this node has too).
    void join_at_start();
    // The round the node trains next: the one after the round in flight beside it, if any.
    uint64_t training_round() const;
    // Whether the node pairs (NoLoCo): it then paces by the rounds members train, and goes on
    // from the swarm's round when it is behind at all (peer/round_pacing.h, catch_up).
    bool pairs() const;
    // Where this node is, in the terms swarm_median_round gives the swarm's.
    uint64_t position() const;
    void catch_up_if_behind();
    // The median round of the compatible members other than this node (with NoLoCo, of the rounds
    // those heard from lately train: median_training_round); none when there are none.
    std::optional<uint64_t> swarm_median_round() const;
    void copy_state_from_swarm(const std::string& why);
    void pace();
    // Before this node trains round k, a member (within max_round_gap of k - 1) that has not yet
    // chosen a partner for round k - 1 is waited for, at most kSlowerWaitPhases of this node's own
    // inner phases (and pace_timeout_s): both then train round k from about the same time, this
    // node knows whether the member went solo, and asks it first at the end of k if it did
    // (docs/spec.md section 4), instead of leaving it to fall rounds behind and pair with nobody.
    // This node keeps at least a third of its speed; a member slower than that still falls behind,
    // and catches up by skipping.
    void wait_for_slower();
    void after_round(const SwarmRound& round);
    void checkpoint();
    // Sleeps up to `seconds`, waking early on a drain; returns false when draining.
    bool sleep_unless_draining(double seconds);
    void set_phase(v1::NodePhase phase);

    NodeConfig config_;
    std::unique_ptr<SwarmNode> node_;
    std::unique_ptr<NodeState> state_;
    bool resumed_ = false;
    std::optional<uint64_t> checkpointed_round_;
    // Checkpoints failed since the last one written: a full disk fails every round, and one line a
    // minute says so.
    uint64_t failed_checkpoints_ = 0;
    Throttle checkpoint_failure_log_{std::chrono::minutes(1)};
    // Rounds the swarm's median moved on during the last state copy: what a copy costs here.
    std::optional<uint64_t> copy_cost_rounds_;
    // The config's, as of the last reload (the reloading thread's).
    std::vector<std::string> seeds_;
    std::atomic<int> checkpoint_every_, keep_checkpoints_;
    std::atomic<bool> drain_{false};
    // Held while drain_ is set and while a sleep checks it, so the notify cannot fall between the
    // check and the wait.
    Mutex wake_mutex_;
    std::condition_variable wake_;
    RoundWatch watch_;
};

}  // namespace starling
