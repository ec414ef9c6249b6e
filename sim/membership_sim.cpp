#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "peer/anchors.h"
#include "peer/wire.h"
#include "sim/simulation.h"

namespace starling::sim {
namespace internal {

uint32_t Simulation::add_node(Time now) {
    const auto index = static_cast<uint32_t>(nodes_.size());
    Member self;
    self.node_id = mix64(config_.seed ^ mix64(0x4e4f4445ull + index));
    self.address = "10." + std::to_string((index >> 16) & 255) + "." +
                   std::to_string((index >> 8) & 255) + "." + std::to_string(index & 255) + ":7700";
    self.incarnation = kEpochMs + static_cast<uint64_t>(now.count() / 1'000'000);
    self.fingerprint = config_.protocol.fingerprint;
    self.model = config_.protocol.model;
    self.method = config_.protocol.method;
    self.swarm_id = "starling";
    for (size_t i = 0; i < self.public_key.size(); i += 8) {
        const uint64_t word = mix64(self.node_id + i);
        for (size_t b = 0; b < 8 && i + b < self.public_key.size(); b++)
            self.public_key[i + b] = static_cast<uint8_t>(word >> (8 * b));
    }
    self.instance = mix64(self.node_id ^ static_cast<uint64_t>(now.count()));
    Node node;
    node.id = self.node_id;
    // The simulated nodes' verdicts are known from the start (below; without private nodes every
    // one stands for a public node whose verdict came at once), so no member waits for one.
    SwimSettings swim = config_.protocol.swim;
    swim.unknown_grace = std::chrono::milliseconds(0);
    node.core = std::make_unique<SwimCore>(self, config_.protocol.limits, swim,
                                           mix64(self.node_id ^ config_.seed));
    node.slow = std::uniform_real_distribution<double>(0, 1)(rng_) < config_.churn.slow_share;
    // Drawn only when asked for, so swarms without private nodes keep their traces.
    node.unreachable =
        config_.network.private_share > 0 && index >= static_cast<uint32_t>(config_.seeds) &&
        std::uniform_real_distribution<double>(0, 1)(rng_) < config_.network.private_share;
    // starlingd's dial-backs give each node its verdict within seconds (docs/nat.md); the
    // simulator gives it at the start, and only where some nodes are private, so that swarms
    // without them keep their traces.
    if (config_.network.private_share > 0)
        node.core->table().set_reachability(node.unreachable ? Reachability::Private
                                                             : Reachability::Public);
    if (config_.rounds.enabled) {
        const RoundsConfig& rc = config_.rounds;
        node.rounds.book = std::make_unique<PairingBook>(self.node_id, rc.max_round_gap);
        node.rounds.step_s =
            rc.step_s_min * std::pow(rc.step_s_max / rc.step_s_min,
                                     std::uniform_real_distribution<double>(0, 1)(rng_));
        node.core->table().set_step_seconds(node.rounds.step_s);
    }
    node.seeds = std::make_unique<SeedRetries>(config_.protocol.gossip_interval,
                                               config_.protocol.join_backoff_max);
    for (uint32_t seed = 0; seed < static_cast<uint32_t>(config_.seeds) && seed < index; seed++)
        node.seeds->add(nodes_[seed].core->table().self().address);
    index_of_[self.node_id] = index;
    index_of_address_[self.address] = index;
    nodes_.push_back(std::move(node));
    return index;
}

void Simulation::schedule(Event event) {
    event.seq = seq_++;
    queue_.push_back(std::move(event));
    std::push_heap(queue_.begin(), queue_.end(), Later{});
}

void Simulation::schedule_at(Time at, EventType type, uint32_t node, uint64_t call) {
    Event event;
    event.at = at;
    event.type = type;
    event.node = node;
    event.call = call;
    schedule(std::move(event));
}

double Simulation::churn_rate(ChurnKind kind) const {
    const ChurnConfig& c = config_.churn;
    if (kind == ChurnKind::Join) return c.joins_per_hour / 3600.0;
    const double per_node = kind == ChurnKind::Leave   ? c.leaves_per_node_hour
                            : kind == ChurnKind::Crash ? c.crashes_per_node_hour
                                                       : c.freezes_per_node_hour;
    size_t up = 0;
    for (const Node& node : nodes_) up += node.status == Status::Up;
    return per_node * static_cast<double>(up) / 3600.0;
}

// The rate is taken at each event from the nodes up then: a Poisson process whose rate follows
// the swarm's size.
void Simulation::schedule_churn(ChurnKind kind, Time now) {
    const double rate = churn_rate(kind);
    if (rate <= 0) return;
    Event event;
    event.at =
        now + duration_cast<Time>(Seconds(std::exponential_distribution<double>(rate)(rng_)));
    event.type = EventType::Churn;
    event.churn = kind;
    schedule(std::move(event));
}

size_t Simulation::digest_bytes(const Member& member) {
    const uint64_t key = member.incarnation * 8 + static_cast<uint64_t>(member.state);
    auto& cached = digest_size_[member.node_id];
    if (cached.second == 0 || cached.first != key) {
        v1::MemberDigest digest;
        to_digest(member, &digest);
        cached = {key, digest.ByteSizeLong()};
    }
    return cached.second;
}

size_t Simulation::message_bytes(const Message& message) {
    size_t bytes = 0;
    for (const Member& m : message.members) {
        const size_t digest = digest_bytes(m);
        bytes += 1 + varint_bytes(digest) + digest;
    }
    switch (message.kind) {
        case Kind::Ping: return bytes + 9;  // target_id
        case Kind::PingReq:
            return bytes + 9 + 2 + nodes_[message.target].core->table().self().address.size();
        case Kind::PingReqAnswer: return bytes + 2;
        // A round's calls: their fields, and the round messages and state copies at their size.
        case Kind::Pair: return 32;
        case Kind::PairAnswer: return 8 + message.rounds.answer.reason.size();
        case Kind::Exchange: return static_cast<size_t>(config_.rounds.message_bytes);
        case Kind::StateRequest: return 16;
        case Kind::StateAnswer: return static_cast<size_t>(config_.rounds.state_bytes);
        default: return bytes;
    }
}

void Simulation::count_refresh(const Node& member, Time now) {
    if (now < warmup_) return;
    const size_t digest = digest_bytes(member.core->table().self());
    payload_bytes_ += static_cast<double>(9 + 1 + varint_bytes(digest) + digest);
    ++calls_;
}

bool Simulation::reaches(const Message& message) const {
    const Node& to = nodes_[message.to];
    if (!to.unreachable || !is_call(message.kind)) return true;  // answers ride the caller's call
    const Node& from = nodes_[message.from];
    // A ping from one of its anchors rides the stream the private node holds to it.
    if (message.kind == Kind::Ping) {
        const std::vector<uint64_t>& anchors = to.core->table().self().anchors;
        return std::find(anchors.begin(), anchors.end(), from.id) != anchors.end();
    }
    // An exchange runs on the stream its opener dialed: it reaches a private node that opened it.
    if (message.kind != Kind::Exchange) return false;
    return !from.unreachable && opens_exchange(to.core->table().self(), from.core->table().self());
}

std::optional<uint32_t> Simulation::relay_anchor(const Message& message) const {
    const Node& to = nodes_[message.to];
    // A proposal to a private node goes through its anchor; so does an exchange between two
    // private nodes (in starlingd through the anchor that passed their proposal on, one relay for
    // both directions; here each direction through the receiver's).
    const bool relayed = message.kind == Kind::Pair ||
                         (message.kind == Kind::Exchange && nodes_[message.from].unreachable);
    if (!relayed || !to.unreachable) return std::nullopt;
    for (const uint64_t id : to.core->table().self().anchors)
        if (const uint32_t anchor = index_of_.at(id); nodes_[anchor].status == Status::Up)
            return anchor;
    return std::nullopt;
}

void Simulation::send(Message message, Time now) {
    Node& from = nodes_[message.from];
    const size_t bytes = message_bytes(message);
    const bool bulk = message.kind == Kind::Exchange || message.kind == Kind::StateAnswer;
    if (now >= warmup_ && is_membership(message.kind)) {
        payload_bytes_ += static_cast<double>(bytes);
        calls_ += is_call(message.kind) ? 1 : 0;
        figures_.largest_message_bytes =
            std::max(figures_.largest_message_bytes, static_cast<double>(bytes));
    }
    if (const auto anchor = relay_anchor(message)) {
        // Two hops: to the anchor, then down the stream the private node holds to it. (The
        // answer comes back direct here, a hop shorter than through the anchor.)
        if (network_.cut(message.from, *anchor, now) || network_.cut(*anchor, message.to, now))
            return;
        Node& via = nodes_[*anchor];
        Event event;
        if (bulk) {
            // The relay passes each frame on as it comes: the slower hop's rate, both hops' delay.
            const Time in =
                network_.bulk_arrival(message.from, *anchor, bytes, now, from.upload_free);
            const Time out =
                network_.bulk_arrival(*anchor, message.to, bytes, now, via.upload_free);
            event.at = std::max(in, out) + network_.round_trip(message.from, *anchor) / 2;
        } else {
            const Time at_anchor =
                network_.arrival(message.from, *anchor, bytes, now, from.upload_free, rng_);
            event.at =
                network_.arrival(*anchor, message.to, bytes, at_anchor, via.upload_free, rng_);
        }
        if (nodes_[message.to].slow) event.at += from_ms(config_.churn.slow_delay_ms);
        event.type = EventType::Deliver;
        event.node = message.to;
        event.message = std::move(message);
        return schedule(std::move(event));
    }
    if (network_.cut(message.from, message.to, now)) return;
    if (!reaches(message)) {
        figures_.pair_calls_lost += message.kind == Kind::Pair;
        return;
    }
    Event event;
    event.at = bulk
                   ? network_.bulk_arrival(message.from, message.to, bytes, now, from.upload_free)
                   : network_.arrival(message.from, message.to, bytes, now, from.upload_free, rng_);
    if (nodes_[message.to].slow) event.at += from_ms(config_.churn.slow_delay_ms);
    event.type = EventType::Deliver;
    event.node = message.to;
    event.message = std::move(message);
    schedule(std::move(event));
}

void Simulation::record(const Event& event) {
    const uint64_t kind = event.type == EventType::Churn
                              ? static_cast<uint64_t>(event.churn)
                              : static_cast<uint64_t>(event.message.kind);
    const uint64_t fields[4] = {static_cast<uint64_t>(event.at.count()), event.node, event.call,
                                static_cast<uint64_t>(event.type) << 8 | kind};
    figures_.trace_hash = XXH3_64bits_withSeed(fields, sizeof(fields), figures_.trace_hash);
    ++figures_.events;
}

void Simulation::tick(uint32_t n, Time now) {
    Node& node = nodes_[n];
    node.period_start = now;
    SwimCore::Period period = node.core->tick(clock_at(now));
    for (const uint64_t id : period.declared_dead) {
        const Status status = nodes_[index_of_.at(id)].status;
        if (now < warmup_) continue;
        if (status == Status::Up) ++figures_.false_deaths;
        if (status == Status::Frozen) ++figures_.frozen_deaths;
    }
    node.gossip_target = std::move(period.gossip);
    node.probe_next = std::move(period.probe);
    if (node.unreachable) hold_anchors(n);
    // As MembershipProtocol::maintain_seeds: a seed that is no reachable member is dialled.
    node.seeds_due = node.seeds->due(clock_at(now), [&](const std::string& address) {
        const auto state = node.core->table().state_of(nodes_[index_of_address_.at(address)].id);
        return state == MemberState::Alive || state == MemberState::Suspect;
    });
    std::reverse(node.seeds_due.begin(), node.seeds_due.end());
    next_seed(n, now);
}

void Simulation::hold_anchors(uint32_t n) {
    SwimCore& core = *nodes_[n].core;
    const std::vector<uint64_t> current = core.table().self().anchors;
    if (anchors_hold(core.table(), current)) return;
    std::set<uint64_t> full;
    for (const auto& [anchor, held] : anchored_)
        if (held >= kAnchorStreamsMax &&
            std::find(current.begin(), current.end(), anchor) == current.end())
            full.insert(anchor);
    release_anchors(n);
    const std::vector<uint64_t> chosen = choose_anchors(
        nodes_[n].id, core.table().reachable_others(), current,
        [&](uint64_t id) { return core.round_trip_ms(id); }, full);
    for (const uint64_t anchor : chosen) ++anchored_[anchor];
    core.table().set_anchors(chosen);
}

void Simulation::release_anchors(uint32_t n) {
    for (const uint64_t anchor : nodes_[n].core->table().self().anchors)
        if (auto it = anchored_.find(anchor); it != anchored_.end() && --it->second == 0)
            anchored_.erase(it);
}

void Simulation::next_seed(uint32_t n, Time now) {
    Node& node = nodes_[n];
    if (node.seeds_due.empty()) return start_probe(n, now);
    node.seed = node.seeds_due.back();
    node.seeds_due.pop_back();
    node.phase = Phase::Seeding;
    node.call = next_call_++;
    send({Kind::Join,
          n,
          index_of_address_.at(node.seed),
          node.call,
          0,
          false,
          {node.core->table().self()}},
         now);
    schedule_at(now + 4 * config_.protocol.probe_timeout, EventType::Timeout, n, node.call);
}

void Simulation::start_probe(uint32_t n, Time now) {
    Node& node = nodes_[n];
    if (!node.probe_next) return start_gossip(n, now);
    node.probe_target = *node.probe_next;
    node.phase = Phase::Direct;
    node.call = next_call_++;
    node.probe_sent = now;
    node.direct_open = true;
    node.probe_timeout =
        node.core->probe_timeout_for(node.probe_target.node_id, config_.protocol.probe_timeout);
    if (!node.core->direct_probe(node.probe_target)) {
        node.direct_open = false;
        return start_indirect(n, now);
    }
    send({Kind::Ping, n, index_of_.at(node.probe_target.node_id), node.call, 0, false, {}}, now);
    schedule_at(now + node.probe_timeout, EventType::Timeout, n, node.call);
}

void Simulation::start_indirect(uint32_t n, Time now) {
    Node& node = nodes_[n];
    // The direct ping stays open (MembershipProtocol::probe) under its own call id.
    const auto helpers = node.core->indirect_helpers(node.probe_target.node_id);
    node.direct_call = node.call;
    node.phase = Phase::Indirect;
    node.call = next_call_++;
    node.indirect_waiting = helpers.size();
    node.indirect_reached = false;
    const uint32_t target = index_of_.at(node.probe_target.node_id);
    for (const Member& helper : helpers)
        send({Kind::PingReq, n, index_of_.at(helper.node_id), node.call, target, false, {}}, now);
    if (helpers.empty() && !node.direct_open) return conclude_indirect(n, now);
    schedule_at(now + 2 * node.probe_timeout, EventType::Timeout, n, node.call);
}

void Simulation::start_gossip(uint32_t n, Time now) {
    Node& node = nodes_[n];
    if (!node.gossip_target) return finish_period(n, now);
    node.phase = Phase::Gossip;
    node.call = next_call_++;
    send({Kind::Gossip, n, index_of_.at(node.gossip_target->node_id), node.call, 0, false,
          node.core->gossip_payload()},
         now);
    schedule_at(now + 2 * config_.protocol.probe_timeout, EventType::Timeout, n, node.call);
}

void Simulation::finish_period(uint32_t n, Time now) {
    Node& node = nodes_[n];
    node.phase = Phase::Idle;
    node.call = 0;
    schedule_at(std::max(node.period_start + config_.protocol.gossip_interval, now),
                EventType::Tick, n, node.epoch);
}

void Simulation::conclude_indirect(uint32_t n, Time now) {
    Node& node = nodes_[n];
    if (!node.indirect_reached &&
        node.core->probe_failed(node.probe_target.node_id, clock_at(now))) {
        const uint32_t target = index_of_.at(node.probe_target.node_id);
        const Node& suspected = nodes_[target];
        for (PendingCrash& crash : crashes_)
            if (crash.node == target && !crash.suspected) {
                crash.suspected = true;
                if (crash.at >= warmup_) crash_suspected_.push_back(seconds(now - crash.at));
            }
        // Frozen at any time since the probe began counts as frozen.
        const bool frozen =
            suspected.status == Status::Frozen || suspected.thawed >= node.period_start;
        if (now >= warmup_ && frozen) ++figures_.frozen_suspicions;
        if (now >= warmup_ && !frozen && suspected.status == Status::Up)
            ++(suspected.slow ? figures_.slow_suspicions : figures_.false_suspicions);
        // SwimCore::probe_failed: tell it first hand, when a call can reach it.
        if (callable(node.probe_target)) node.gossip_target = node.probe_target;
    }
    start_gossip(n, now);
}

void Simulation::timeout(uint32_t n, uint64_t call, Time now) {
    Node& node = nodes_[n];
    if (node.status != Status::Up || node.call != call) return;
    switch (node.phase) {
        case Phase::Direct: return start_indirect(n, now);
        case Phase::Indirect:
            node.direct_open = false;  // its deadline, three timeouts after it was sent
            return conclude_indirect(n, now);
        case Phase::Gossip: return finish_period(n, now);
        case Phase::Joining: return start_join(n, now);
        case Phase::Seeding:
            node.seeds->tried(node.seed, false, clock_at(now));
            return next_seed(n, now);
        case Phase::Idle: return;
    }
}

void Simulation::relay_timeout(uint64_t call, Time now) {
    const auto it = relays_.find(call);
    if (it == relays_.end()) return;
    const Relay relay = it->second;
    relays_.erase(it);
    if (nodes_[relay.helper].status == Status::Up)
        send({Kind::PingReqAnswer, relay.helper, relay.origin, relay.origin_call, 0, false, {}},
             now);
}

void Simulation::handle(Message& m, Time now) {
    Node& node = nodes_[m.to];
    if (node.status != Status::Up) return;  // a frozen process answers nothing in time
    const auto clock = clock_at(now);
    // Every message but a leave carries its sender's own digest first (MembershipProtocol's
    // merge_all): the sender is heard from.
    const auto merge_all = [&] {
        for (const Member& member : m.members) node.core->merge(member, clock);
        if (m.kind != Kind::Leave && !m.members.empty())
            node.core->table().heard_from(nodes_[m.from].id, clock);
    };
    switch (m.kind) {
        case Kind::Ping:
            send({Kind::Ack, m.to, m.from, m.call, 0, false, {node.core->table().self()}}, now);
            return;
        case Kind::Ack:
            if (node.phase == Phase::Direct && node.call == m.call) {
                node.core->acked(node.probe_target.node_id, now - node.probe_sent);
                merge_all();
                return start_gossip(m.to, now);
            }
            if (node.phase == Phase::Indirect && node.direct_open && node.direct_call == m.call) {
                node.core->acked(node.probe_target.node_id, now - node.probe_sent);
                merge_all();
                node.direct_open = false;
                node.indirect_reached = true;
                if (node.indirect_waiting == 0) conclude_indirect(m.to, now);
                return;
            }
            if (const auto relay = relays_.find(m.call); relay != relays_.end()) {
                send({Kind::PingReqAnswer,
                      m.to,
                      relay->second.origin,
                      relay->second.origin_call,
                      0,
                      true,
                      {}},
                     now);
                relays_.erase(relay);
            }
            return;
        case Kind::PingReq: {
            const uint64_t call = next_call_++;
            relays_[call] = {m.to, m.from, m.call};
            send({Kind::Ping, m.to, m.target, call, 0, false, {}}, now);
            schedule_at(now + node.core->probe_timeout_for(nodes_[m.target].id,
                                                           config_.protocol.probe_timeout),
                        EventType::RelayTimeout, m.to, call);
            return;
        }
        case Kind::PingReqAnswer:
            if (node.phase != Phase::Indirect || node.call != m.call) return;
            node.indirect_reached = node.indirect_reached || m.reached;
            // As MembershipProtocol::probe: every helper's answer, then the direct ping's.
            if (--node.indirect_waiting == 0 && !node.direct_open) conclude_indirect(m.to, now);
            return;
        case Kind::Gossip:
            merge_all();
            send({Kind::GossipAnswer, m.to, m.from, m.call, 0, false, node.core->gossip_payload()},
                 now);
            return;
        case Kind::GossipAnswer:
            if (node.phase != Phase::Gossip || node.call != m.call) return;
            merge_all();
            return finish_period(m.to, now);
        case Kind::Join:
            merge_all();
            send({Kind::JoinAnswer, m.to, m.from, m.call, 0, false, node.core->table().all()}, now);
            return;
        case Kind::JoinAnswer:
            if (node.phase == Phase::Seeding && node.call == m.call) {
                merge_all();
                node.seeds->tried(node.seed, true, clock);
                return next_seed(m.to, now);
            }
            if (node.phase != Phase::Joining || node.call != m.call) return;
            merge_all();
            node.phase = Phase::Idle;
            node.joined = true;
            tick(m.to, now);
            if (config_.rounds.enabled) request_state(m.to, now);
            return;
        case Kind::Leave: merge_all(); return;
        default: return handle_round(m, now);
    }
}

std::optional<uint32_t> Simulation::random_up(std::optional<uint32_t> except) {
    std::vector<uint32_t> up;
    for (uint32_t i = 0; i < nodes_.size(); i++)
        if (nodes_[i].status == Status::Up && i != except) up.push_back(i);
    if (up.empty()) return std::nullopt;
    return up[std::uniform_int_distribution<size_t>(0, up.size() - 1)(rng_)];
}

// A joiner calls one live member, as a node whose seeds include it; a seed that does not answer
// in 4 probe timeouts is given up for another.
void Simulation::start_join(uint32_t n, Time now) {
    Node& node = nodes_[n];
    const auto seed = random_up(n);
    if (!seed) return;
    node.phase = Phase::Joining;
    node.call = next_call_++;
    send({Kind::Join, n, *seed, node.call, 0, false, {node.core->table().self()}}, now);
    schedule_at(now + 4 * config_.protocol.probe_timeout, EventType::Timeout, n, node.call);
}

void Simulation::churn(ChurnKind kind, Time now) {
    if (kind == ChurnKind::Join) {
        const uint32_t n = add_node(now);
        nodes_[n].joined = false;
        if (now >= warmup_) joins_.push_back({n, now});
        if (now >= warmup_ && config_.rounds.enabled) nodes_[n].rounds.choices_since_join = 0;
        start_join(n, now);
    } else if (const auto chosen = random_up()) {
        Node& node = nodes_[*chosen];
        node.phase = Phase::Idle;
        node.call = 0;
        if (kind == ChurnKind::Leave) {
            node.core->table().leave();
            node.status = Status::Left;
            release_anchors(*chosen);
            for (const Member& m : node.core->table().reachable_others())
                send({Kind::Leave,
                      *chosen,
                      index_of_.at(m.node_id),
                      next_call_++,
                      0,
                      false,
                      {node.core->table().self()}},
                     now);
        } else if (kind == ChurnKind::Crash) {
            node.status = Status::Crashed;
            release_anchors(*chosen);
            crashes_.push_back({*chosen, now});
        } else {
            node.status = Status::Frozen;
            ++node.epoch;
            schedule_at(now + duration_cast<Time>(Seconds(config_.churn.freeze_s)),
                        EventType::Unfreeze, *chosen);
        }
    }
    schedule_churn(kind, now);
}

void Simulation::measure(Time now) {
    size_t up = 0;
    for (const Node& node : nodes_) up += node.status == Status::Up;
    if (now > warmup_)
        figures_.node_hours += static_cast<double>(up) * seconds(kMeasureEvery) / 3600;
    const auto listed_alive = [&](uint32_t member) {
        size_t knowing = 0;
        for (uint32_t i = 0; i < nodes_.size(); i++) {
            if (i == member || nodes_[i].status != Status::Up) continue;
            if (nodes_[i].core->table().state_of(nodes_[member].id) == MemberState::Alive)
                ++knowing;
        }
        return knowing;
    };
    std::erase_if(joins_, [&](const PendingJoin& join) {
        if (nodes_[join.node].status != Status::Up) return true;
        if (listed_alive(join.node) + 1 < up) return false;
        join_known_.push_back(seconds(now - join.since));
        return true;
    });
    std::erase_if(crashes_, [&](const PendingCrash& crash) {
        for (uint32_t i = 0; i < nodes_.size(); i++) {
            if (nodes_[i].status != Status::Up) continue;
            const auto state = nodes_[i].core->table().state_of(nodes_[crash.node].id);
            if (state == MemberState::Alive || state == MemberState::Suspect) return false;
        }
        if (crash.at >= warmup_) crash_known_.push_back(seconds(now - crash.at));
        return true;
    });
    const NetworkConfig& net = config_.network;
    const Time healed = duration_cast<Time>(Seconds(net.partition_at_s + net.partition_s));
    if (net.partition_at_s >= 0 && now >= healed && figures_.partition_healed_s < 0 &&
        alive_view_share() == 1.0)
        figures_.partition_healed_s = seconds(now - healed);
    if (now + kMeasureEvery <= end_) schedule_at(now + kMeasureEvery, EventType::Measure, 0);
}

double Simulation::alive_view_share() const {
    size_t pairs = 0, alive = 0;
    for (const Node& node : nodes_) {
        if (node.status != Status::Up) continue;
        for (const Node& other : nodes_) {
            if (&node == &other || other.status != Status::Up) continue;
            ++pairs;
            alive += node.core->table().state_of(other.id) == MemberState::Alive;
        }
    }
    return pairs ? static_cast<double>(alive) / static_cast<double>(pairs) : 1;
}

Figures Simulation::run() {
    const auto wall_start = std::chrono::steady_clock::now();
    for (int i = 0; i < config_.nodes; i++) add_node(Time{0});
    // A swarm that formed before the simulation starts: every node lists every other alive.
    for (Node& node : nodes_)
        for (const Node& other : nodes_)
            if (&node != &other) node.core->table().merge(other.core->table().self(), clock_at({}));
    // Periods start spread over one interval, as processes started apart would.
    std::uniform_int_distribution<int64_t> offset(
        0, duration_cast<Time>(config_.protocol.gossip_interval).count());
    for (uint32_t i = 0; i < nodes_.size(); i++)
        schedule_at(Time{offset(rng_)}, EventType::Tick, i, nodes_[i].epoch);
    for (const auto kind : {ChurnKind::Join, ChurnKind::Leave, ChurnKind::Crash, ChurnKind::Freeze})
        schedule_churn(kind, Time{0});
    schedule_at(kMeasureEvery, EventType::Measure, 0);
    figures_.nodes_start = config_.nodes;
    if (config_.rounds.enabled)
        for (uint32_t i = 0; i < nodes_.size(); i++) {
            const double phi = std::normal_distribution<double>(0, 1)(rng_);
            record_phi(0, phi);
            start_rounds(i, Time{0}, 0, phi);
        }
    while (!queue_.empty() && queue_.front().at <= end_) {
        std::pop_heap(queue_.begin(), queue_.end(), Later{});
        Event event = std::move(queue_.back());
        queue_.pop_back();
        record(event);
        const Time now = event.at;
        switch (event.type) {
            case EventType::Tick:
                if (nodes_[event.node].status == Status::Up &&
                    nodes_[event.node].epoch == event.call)
                    tick(event.node, now);
                break;
            case EventType::Deliver: handle(event.message, now); break;
            case EventType::Timeout: timeout(event.node, event.call, now); break;
            case EventType::RelayTimeout: relay_timeout(event.call, now); break;
            case EventType::Churn: churn(event.churn, now); break;
            case EventType::Unfreeze:
                if (Node& node = nodes_[event.node]; node.status == Status::Frozen) {
                    node.status = Status::Up;
                    node.thawed = now;
                    node.joined ? tick(event.node, now) : start_join(event.node, now);
                    for (const Event& late : std::exchange(node.rounds.deferred, {}))
                        round_timer(late, now);
                }
                break;
            case EventType::Measure: measure(now); break;
            case EventType::PhaseEnd:
            case EventType::Listen:
            case EventType::PairTimeout:
            case EventType::ExchangeTimeout:
            case EventType::PaceCheck:
                if (Node& node = nodes_[event.node]; node.status == Status::Up)
                    round_timer(event, now);
                else if (node.status == Status::Frozen)
                    node.rounds.deferred.push_back(std::move(event));
                break;
        }
    }
    figures_.nodes_end = static_cast<int>(std::count_if(
        nodes_.begin(), nodes_.end(), [](const Node& node) { return node.status == Status::Up; }));
    figures_.alive_view_share = alive_view_share();
    if (config_.rounds.enabled) finish_round_figures();
    figures_.join_known_by_all = spread_of(join_known_);
    figures_.joins_unfinished = joins_.size();
    figures_.crash_first_suspected = spread_of(crash_suspected_);
    figures_.crash_known_by_all = spread_of(crash_known_);
    figures_.crashes_unfinished = static_cast<size_t>(
        std::count_if(crashes_.begin(), crashes_.end(),
                      [&](const PendingCrash& crash) { return crash.at >= warmup_; }));
    const double node_seconds = figures_.node_hours * 3600;
    if (node_seconds > 0) {
        figures_.payload_bytes_per_node_s = payload_bytes_ / node_seconds;
        figures_.calls_per_node_s = calls_ / node_seconds;
    }
    figures_.wall_s = Seconds(std::chrono::steady_clock::now() - wall_start).count();
    return figures_;
}
}  // namespace internal

Figures simulate_swarm(const SimConfig& config) {
    config.validate();
    return internal::Simulation(config).run();
}

}  // namespace starling::sim
