#include "daemon/service/node_runner.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <unordered_set>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "common/errno_text.h"
#include "common/error.h"
#include "daemon/swarm/swarm_checkpoint.h"
#include "kernels/cpu/cpu_ops.h"

namespace starling {

namespace {

using Clock = std::chrono::steady_clock;

v1::NodeStatus identity_of(const NodeConfig& config, SwarmNode& node, const std::string& version) {
    v1::NodeStatus s;
    s.set_node_id(format_node_id(node.node_id()));
    s.set_swarm_id(config.swarm.peer.swarm_id);
    s.set_address(node.address());
    s.set_version(version);
    s.set_method(std::string(outer_method_name(config.swarm.method)));
    s.set_model_fingerprint(node.replica().manifest().fingerprint());
    s.set_device(node.device());
    s.set_total_steps(static_cast<uint64_t>(config.swarm.train.steps));
    s.set_round(node.round());
    s.set_inner_step(static_cast<uint64_t>(node.inner_step()));
    return s;
}

}  // namespace

bool checkpoint_due(uint64_t round, std::optional<uint64_t> last_checkpoint, int every) {
    return every > 0 && round >= last_checkpoint.value_or(0) + static_cast<uint64_t>(every);
}

NodeRunner::NodeRunner(const NodeConfig& config, const std::string& version, NodeMetrics* metrics)
    : config_(config),
      seeds_(config.swarm.peer.seeds),
      checkpoint_every_(config.checkpoint_every),
      keep_checkpoints_(config.keep_checkpoints) {
    node_ = std::make_unique<SwarmNode>(config_.swarm);
    spdlog::info("device {}: {}", config_.swarm.train.device, node_->device());
    const std::string fingerprint = node_->replica().manifest().fingerprint();
    if (auto saved = newest_swarm_checkpoint(config_.checkpoint_dir(), fingerprint)) {
        try {
            node_->resume(saved->state, saved->data);
        } catch (const Error& e) {
            throw Error("checkpoint " + saved->path.string() + ": " + e.what());
        }
        resumed_ = true;
        checkpointed_round_ = saved->round;
        spdlog::info("resumed from checkpoint {} (round {}, inner step {})", saved->path.string(),
                     node_->round(), node_->inner_step());
    }
    const v1::NodeStatus identity = identity_of(config_, *node_, version);
    state_ = std::make_unique<NodeState>(identity, metrics);
    if (checkpointed_round_) state_->record_checkpoint(*checkpointed_round_);
    node_->set_phase_listener([this](RoundPhase phase) {
        // An exchange ends within T_pair and its budget (at most exchange_timeout_max), each of
        // its two streams by the same deadline; the second's cancellation and the outer step get
        // a few seconds more.
        const PeerConfig& peer = config_.swarm.peer;
        watch_.mark(phase == RoundPhase::Training
                        ? std::chrono::milliseconds(0)
                        : peer.pair_timeout + peer.exchange_timeout_max + std::chrono::seconds(5));
        set_phase(phase == RoundPhase::Training ? v1::NODE_PHASE_TRAINING
                                                : v1::NODE_PHASE_EXCHANGING);
    });
    // Overlapped rounds land between two inner steps of the next round: the checkpoint and the
    // evaluation of a round happen there, on the round thread, while phi is settled.
    node_->set_round_listener([this](const SwarmRound& round) { after_round(round); });
    watch_.mark();  // building the node and loading a checkpoint are done
}

NodeRunner::~NodeRunner() = default;

void NodeRunner::request_drain() {
    {
        const MutexLock lock(wake_mutex_);
        drain_ = true;
    }
    wake_.notify_all();
}

void NodeRunner::reload(const NodeConfig& config) {
    checkpoint_every_ = config.checkpoint_every;
    keep_checkpoints_ = config.keep_checkpoints;
    std::vector<std::string> added;
    for (const std::string& seed : config.swarm.peer.seeds)
        if (std::find(seeds_.begin(), seeds_.end(), seed) == seeds_.end()) added.push_back(seed);
    seeds_.insert(seeds_.end(), added.begin(), added.end());
    if (!added.empty()) add_seeds(added);
    spdlog::info("reloaded: checkpoint every {} rounds, keep {}, {} new seed(s)",
                 config.checkpoint_every, config.keep_checkpoints, added.size());
    // Last: certificates that would not work throw, and the settings above are in effect already.
    node_->reload_tls(config.swarm.peer.tls);
}

void NodeRunner::set_phase(v1::NodePhase phase) {
    // A drain is what the node is doing from the moment it is asked for.
    const v1::NodePhase now = drain_.load() ? v1::NODE_PHASE_DRAINING : phase;
    state_->set_phase(now);
}

void NodeRunner::lower_this_thread_priority(int by) {
    if (by == 0) return;
    // On Linux a nice value is a thread's own; threads started from here inherit it.
    const auto tid = static_cast<id_t>(::syscall(SYS_gettid));
    errno = 0;
    const int lowered = std::min(::getpriority(PRIO_PROCESS, tid) + by, 19);
    if (errno != 0 || ::setpriority(PRIO_PROCESS, tid, lowered) != 0)
        spdlog::warn("[node].training_nice {}: cannot lower the round loop's priority: {}", by,
                     errno_text(errno));
    else
        spdlog::info("the round loop runs at nice {}", lowered);
}

bool NodeRunner::sleep_unless_draining(double seconds) {
    watch_.mark(std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::duration<double>(seconds)));
    MutexLock lock(wake_mutex_);
    lock.wait_for(wake_, std::chrono::duration<double>(seconds), [&] { return drain_.load(); });
    return !drain_.load();
}

std::vector<PairingFacts> NodeRunner::compatible_others() const {
    std::vector<PairingFacts> others;
    for (const KnownPeer& peer : node_->view().others)
        if (peer.pairable) others.push_back(pairing_facts(peer.member));
    return others;
}

void NodeRunner::join_at_start() {
    if (resumed_ || config_.swarm.peer.seeds.empty()) return;
    const auto deadline = Clock::now() + std::chrono::duration<double>(config_.join_timeout_s);
    while (compatible_others().empty() && Clock::now() < deadline)
        if (!sleep_unless_draining(0.1)) return;
    const std::vector<PairingFacts> others = compatible_others();
    if (others.empty()) {
        spdlog::warn(
            "no compatible member answered within {} s; starting from the initial weights and joining "
            "whoever appears later",
            config_.join_timeout_s);
        return;
    }
    // Members still at round 0 hold the initial weights this node has too.
    uint64_t newest = 0;
    for (const PairingFacts& m : others) newest = std::max(newest, m.round);
    if (newest > node_->round())
        copy_state_from_swarm(fmt::format("a fresh node in a swarm at round {}", newest));
}

bool NodeRunner::pairs() const { return config_.swarm.method == OuterMethod::NoLoCo; }

std::vector<PairingFacts> NodeRunner::heard_others() const {
    return heard_lately(compatible_others(), Clock::now(), node_->phase_seconds());
}

std::optional<uint64_t> NodeRunner::swarm_median_round() const {
    return pairs() ? median_training_round(heard_others()) : median_round(compatible_others());
}

uint64_t NodeRunner::position() const { return pairs() ? training_round() : node_->round(); }

uint64_t NodeRunner::training_round() const {
    // A member advertises the round it last chose a partner for, and trains the one after it.
    return node_->round() + (node_->exchange_in_flight() ? 1 : 0);
}

void NodeRunner::catch_up_if_behind() {
    const std::optional<uint64_t> median = swarm_median_round();
    const uint64_t gap = config_.swarm.peer.max_round_gap, at = position();
    const CatchUp decision = catch_up(median, at, gap, copy_cost_rounds_, pairs());
    if (decision == CatchUp::None) return;
    const uint64_t behind = *median - at;
    if (decision == CatchUp::Skip) {
        spdlog::info(
            "round {} is {} behind the swarm's median round {}, and {}: the node goes on from "
            "round {} with its own state",
            at, behind, *median,
            behind <= gap
                ? "its choices would come after the others are done with its rounds"
                : fmt::format("a state copy cost {} rounds last time", *copy_cost_rounds_),
            *median);
        node_->skip_to_round(*median);
        state_->set_position(node_->round(), node_->inner_step());
        return;
    }
    copy_state_from_swarm(
        fmt::format("round {} is behind the swarm's median round {}", at, *median));
}

void NodeRunner::copy_state_from_swarm(const std::string& why) {
    set_phase(v1::NODE_PHASE_JOINING);
    spdlog::info("{}: copying the state from the swarm", why);
    const std::optional<uint64_t> median_before = swarm_median_round();
    try {
        // Each chunk is a call within state_sync_timeout_max; a fetch that stops delivering them
        // (every donor gone) gives up after a few.
        const auto chunk_allowance =
            config_.swarm.peer.state_sync_timeout_max + std::chrono::seconds(10);
        watch_.mark(chunk_allowance);
        node_->join_from_swarm([this, chunk_allowance] { watch_.mark(chunk_allowance); });
    } catch (const Error& e) {
        state_->record_state_copy_failure();
        spdlog::warn("copying the state failed, training on from round {}: {}", node_->round(),
                     e.what());
        return;
    }
    const std::optional<uint64_t> median = swarm_median_round();
    if (median && median_before)
        copy_cost_rounds_ = *median > *median_before ? *median - *median_before : 0;
    const uint64_t gap = config_.swarm.peer.max_round_gap;
    if (const auto from = round_after_copy(median, node_->round(), gap, pairs())) {
        spdlog::info(
            "the copy landed at round {}, the swarm's median round {}: the node goes on from round "
            "{} with the state it copied{}",
            node_->round(), *median, *from,
            pairs() ? ", its first phase beside the members' next"
                    : " (max_round_gap " + std::to_string(gap) + ")");
        node_->skip_to_round(*from);
    }
    state_->set_position(node_->round(), node_->inner_step());
}

void NodeRunner::pace() {
    const auto deadline = Clock::now() + std::chrono::duration<double>(config_.pace_timeout_s);
    const uint64_t gap = config_.swarm.peer.max_round_gap;
    auto ahead = [&] { return ahead_of_all(compatible_others(), node_->round(), gap); };
    if (!ahead()) return;
    set_phase(v1::NODE_PHASE_WAITING);
    spdlog::debug("round {} is ahead of every member by more than {}: waiting up to {} s for one",
                  node_->round(), gap, config_.pace_timeout_s);
    while (ahead() && Clock::now() < deadline)
        if (!sleep_unless_draining(0.05)) return;
}

void NodeRunner::wait_for_slower() {
    const uint64_t training = training_round();
    const uint64_t gap = config_.swarm.peer.max_round_gap;
    auto slower_now = [&] { return slower_in_reach(heard_others(), training, gap); };
    std::vector<uint64_t> slower = slower_now();
    if (slower.empty()) return;
    const double bound =
        std::min(config_.pace_timeout_s, kSlowerWaitPhases * node_->phase_seconds());
    const auto deadline = Clock::now() + std::chrono::duration<double>(bound);
    set_phase(v1::NODE_PHASE_WAITING);
    spdlog::debug(
        "a member has not chosen a partner for round {} yet: waiting up to {:.3f} s for it",
        training - 1, bound);
    // Asked directly: gossip would carry their new rounds an interval or more late, and every
    // round would lose that much training time.
    const double every = slower_refresh_seconds(node_->phase_seconds());
    SlowerWait wait(slower);
    std::unordered_set<uint64_t> still(slower.begin(), slower.end());
    const auto still_slower = [&](uint64_t id) { return still.contains(id); };
    while (Clock::now() < deadline) {
        const auto asked = Clock::now();
        node_->refresh(wait.next(still_slower));
        slower = slower_now();
        still = {slower.begin(), slower.end()};
        if (wait.over(still_slower)) return;
        const double left = every - std::chrono::duration<double>(Clock::now() - asked).count();
        if (!sleep_unless_draining(std::max(left, 0.0))) return;
    }
}

void NodeRunner::checkpoint() {
    const RoundStart& start = node_->round_start();
    const uint64_t round = start.snapshot->round();
    if (checkpointed_round_ == round) return;
    const auto path = save_swarm_checkpoint(config_.checkpoint_dir(),
                                            static_cast<size_t>(keep_checkpoints_.load()),
                                            node_->replica().manifest().fingerprint(), start);
    checkpointed_round_ = round;
    state_->record_checkpoint(round);
    if (failed_checkpoints_ == 0) return spdlog::info("checkpoint {} written", path.string());
    spdlog::info("checkpoint {} written, after {} round(s) of failed checkpoints", path.string(),
                 failed_checkpoints_);
    failed_checkpoints_ = 0;
    checkpoint_failure_log_ = Throttle(std::chrono::minutes(1));  // the next failure is news
}

void NodeRunner::after_round(const SwarmRound& round) {
    const uint64_t weight_bytes = node_->replica().size() * sizeof(float);
    state_->record_round(round, node_->round(), node_->inner_step(), weight_bytes);
    state_->forget_departed(node_->view());
    watch_.mark();
    if (config_.eval_every > 0 && node_->round() % static_cast<uint64_t>(config_.eval_every) == 0) {
        // The validation shards are opened here for the first time: a failure (no file
        // descriptor left, a shard gone) costs this evaluation, never the node.
        try {
            const double loss = node_->evaluate();
            state_->record_val_loss(loss);
            spdlog::info("round {}: validation loss of the averaged weights {:.4f}", node_->round(),
                         loss);
        } catch (const Error& e) {
            spdlog::error("round {}: the validation loss could not be computed: {}", node_->round(),
                          e.what());
        }
    }
    if (checkpoint_due(node_->round(), checkpointed_round_, checkpoint_every_.load())) {
        try {
            checkpoint();
        } catch (
            const Error& e) {  // a full disk, say: the node trains on and tries again next round
            const std::string why =
                fmt::format("checkpoint of round {} failed: {}", node_->round(), e.what());
            failed_checkpoints_++;
            if (checkpoint_failure_log_.due())
                spdlog::error(
                    "{} ({} failed in a row; tried again every round, logged once a "
                    "minute)",
                    why, failed_checkpoints_);
            state_->record_checkpoint_failure(why);
        }
    }
}

void NodeRunner::run() {
    lower_this_thread_priority(config_.training_nice);
    join_at_start();
    // Where start-up ends: what follows is training, exchanges and waits (bench/swarm_wan's
    // utilization counts from this line).
    spdlog::info("training from round {} (inner step {})", node_->round(), node_->inner_step());
    while (!drain_.load()) {
        if (node_->schedule_done()) {
            node_->land_exchange();
            checkpoint();
            set_phase(v1::NODE_PHASE_DONE);
            spdlog::info(
                "all {} steps of the schedule are taken (round {}); serving the state until stopped",
                config_.swarm.train.steps, node_->round());
            while (sleep_unless_draining(3600.0)) {
            }
            break;
        }
        if (config_.swarm.method != OuterMethod::Local) {
            catch_up_if_behind();
            pace();
            if (config_.swarm.method == OuterMethod::NoLoCo) wait_for_slower();
        }
        if (drain_.load()) break;
        if (node_->run_round(drain_).abandoned) break;
    }
    set_phase(v1::NODE_PHASE_DRAINING);
    spdlog::info("draining: checkpoint of round {}, then leaving the swarm", node_->round());
    std::exception_ptr failure;
    try {
        node_->land_exchange();
        checkpoint();
    } catch (...) {
        failure = std::current_exception();
    }
    node_->leave();
    if (failure) std::rethrow_exception(failure);
}

}  // namespace starling
