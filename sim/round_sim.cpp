// Rounds in the simulation, as SwarmNode's loop and RoundPeers run them: an inner phase paced by
// peer/round_pacing.h, a partner chosen with PartnerChoice (the proposer's steps) and PairingBook
// (the answers), the exchange of the round's messages (one after the other, or beside the next
// phase), and phi averaged with the partner's: NoLoCo's pairwise mixing on a scalar.
#include <algorithm>
#include <cmath>

#include "peer/partners.h"
#include "peer/round_pacing.h"
#include "sim/simulation.h"

namespace starling::sim::internal {

namespace {

Time from_s(double s) { return duration_cast<Time>(Seconds(s)); }

// How often a node ahead of every member looks again (NodeRunner::pace polls every 50 ms); one
// waiting for slower members asks them as often as NodeRunner::wait_for_slower does.
constexpr Time kPacePoll = std::chrono::milliseconds(50);

}  // namespace

void Simulation::schedule_round(uint32_t n, Time at, EventType type) {
    RoundState& rs = nodes_[n].rounds;
    schedule_at(at, type, n, rs.token = ++rs.next_token);
}

void Simulation::schedule_choice(uint32_t n, Time at, EventType type) {
    RoundState& rs = nodes_[n].rounds;
    schedule_at(at, type, n, rs.choice_token = ++rs.next_token);
}

// A state copy replaces phi: the choice and the exchange in flight are dropped (starlingd lands
// them first; a node that far behind rarely has a partner for them).
void Simulation::drop_choice(uint32_t n) {
    RoundState& rs = nodes_[n].rounds;
    rs.exchange.reset();
    if (!rs.choosing) return;
    rs.book->close(rs.choice_round);
    rs.choice.reset();
    rs.choosing = rs.proposing = rs.crossed = false;
}

void Simulation::record_phi(uint64_t round, double phi) {
    if (phi_sums_.size() <= round) phi_sums_.resize(round + 1);
    PhiSums& sums = phi_sums_[round];
    sums.count += 1;
    sums.sum += phi;
    sums.squares += phi * phi;
}

void Simulation::start_rounds(uint32_t n, Time now, uint64_t round, double phi) {
    RoundState& rs = nodes_[n].rounds;
    rs.round = round;
    rs.phi = phi;
    nodes_[n].core->table().set_round(round);
    next_round(n, now);
}

// The round NodeRunner paces by (SwarmNode::round): the one whose choice or exchange is in flight
// beside the next phase, else the next to train.
static uint64_t pacing_round(const RoundState& rs) {
    return rs.choosing || rs.exchange ? rs.round - 1 : rs.round;
}

// NodeRunner::heard_others.
std::vector<PairingFacts> Simulation::heard_others(uint32_t n, Time now) const {
    return heard_lately(nodes_[n].core->table().pairable_facts(), clock_at(now),
                        nodes_[n].rounds.phase_s);
}

// NodeRunner::run's loop before each round: catch up when behind, wait when ahead of all, wait
// for a slower member.
void Simulation::next_round(uint32_t n, Time now) {
    RoundState& rs = nodes_[n].rounds;
    const uint64_t gap = config_.rounds.max_round_gap;
    const auto others = nodes_[n].core->table().pairable_facts();
    // The view once: at thousands of nodes each copy of it is a pass over the table.
    const auto median = median_training_round(heard_lately(others, clock_at(now), rs.phase_s));
    switch (catch_up(median, rs.round, gap, rs.copy_cost, true)) {
        case CatchUp::None: break;
        case CatchUp::Skip:
            if (now >= warmup_) ++figures_.skips;
            rs.round = *median;
            nodes_[n].core->table().set_round(rs.round);
            break;
        case CatchUp::Copy:
            drop_choice(n);
            rs.median_before_copy = median;
            return request_state(n, now);
    }
    if (ahead_of_all(others, pacing_round(rs), gap)) {
        if (now >= warmup_) ++figures_.ahead_waits;
        rs.stage = Stage::Waiting;
        rs.wait_start = now;
        rs.wait = Wait::Ahead;
        rs.wait_until = now + from_s(config_.rounds.pace_timeout_s);
        return schedule_round(n, now + kPacePoll, EventType::PaceCheck);
    }
    wait_or_train(n, now);
}

void Simulation::wait_or_train(uint32_t n, Time now) {
    RoundState& rs = nodes_[n].rounds;
    const auto slower =
        slower_in_reach(heard_others(n, now), rs.round, config_.rounds.max_round_gap);
    if (slower.empty()) return start_phase(n, now);
    if (now >= warmup_) ++figures_.slower_waits;
    if (rs.stage != Stage::Waiting) rs.wait_start = now;
    rs.stage = Stage::Waiting;
    rs.wait = Wait::Slower;
    rs.slower = SlowerWait(slower);
    rs.wait_until =
        now + from_s(std::min(config_.rounds.pace_timeout_s, kSlowerWaitPhases * rs.phase_s));
    schedule_round(n, now, EventType::PaceCheck);
}

void Simulation::pace_check(uint32_t n, Time now) {
    RoundState& rs = nodes_[n].rounds;
    const uint64_t gap = config_.rounds.max_round_gap;
    if (rs.wait == Wait::Ahead) {
        if (now >= rs.wait_until ||
            !ahead_of_all(nodes_[n].core->table().pairable_facts(), pacing_round(rs), gap))
            return wait_or_train(n, now);
        return schedule_round(n, now + kPacePoll, EventType::PaceCheck);
    }
    // NodeRunner asks some of the slower members directly (refresh, SlowerWait), at once and then
    // every slower_refresh_seconds: their digests as they say them now (rounds and choices, merged
    // as MembershipProtocol::refresh merges a Ping's answer), a Ping and its answer each, counted
    // as membership traffic (not sent as events: the answer is taken as of now). The others' are
    // as gossip brought them. As in NodeRunner, only those slower when the wait began are waited
    // for.
    MemberTable& table = nodes_[n].core->table();
    const auto still_slower = [&](uint64_t id) {
        const auto round = table.alive_round(id);
        return round && is_slower_in_reach(*round, rs.round, gap);
    };
    for (const uint64_t id : rs.slower.next(still_slower)) {
        const Node& member = nodes_[index_of_.at(id)];
        if (member.status != Status::Up) continue;
        nodes_[n].core->merge(member.core->table().self(), clock_at(now));
        nodes_[n].core->table().heard_from(id, clock_at(now));
        count_refresh(member, now);
    }
    if (rs.slower.over(still_slower) || now >= rs.wait_until) return start_phase(n, now);
    schedule_round(n, now + from_s(slower_refresh_seconds(rs.phase_s)), EventType::PaceCheck);
}

void Simulation::start_phase(uint32_t n, Time now) {
    RoundState& rs = nodes_[n].rounds;
    const RoundsConfig& rc = config_.rounds;
    if (rs.stage == Stage::Waiting && now >= warmup_)
        wait_seconds_.push_back(seconds(now - rs.wait_start));
    rs.stage = Stage::Training;
    rs.budget = rc.round_seconds > 0
                    ? rc.round_seconds
                    : automatic_round_seconds(nodes_[n].core->table().pairable_step_seconds(),
                                              rc.inner_steps, rc.uneven_margin, rs.budget > 0);
    rs.phase_s = phase_steps_in(rs.budget, rs.step_s, rc.inner_steps) * rs.step_s;
    schedule_round(n, now + from_s(rs.phase_s), EventType::PhaseEnd);
}

void Simulation::phase_end(uint32_t n, Time now) {
    RoundState& rs = nodes_[n].rounds;
    // Overlapped: the last round's choice and exchange must land before this one's partner is
    // chosen.
    if (rs.choosing || rs.exchange) {
        rs.stage = Stage::Landing;
        return;
    }
    choose(n, now);
}

// RoundPeers::choose_partner's set-up, then its loop as events.
std::vector<uint64_t> Simulation::unreachable_in_matching(const MemberTable& table) const {
    if (!config_.network.direct_first) return {};
    return table.private_pairable_ids();
}

void Simulation::choose(uint32_t n, Time now) {
    Node& node = nodes_[n];
    RoundState& rs = node.rounds;
    MemberTable& table = node.core->table();
    const uint64_t round = rs.round;
    rs.choosing = true;
    rs.choice_round = round;
    // As RoundPeers::choose_partner: the members heard from since the last choice began first.
    const auto heard_since =
        rs.choice_start >= Time{0} ? clock_at(rs.choice_start) : SteadyClock::time_point::min();
    rs.choice_start = now;
    table.set_round(round);
    const auto view = table.pairable_ids();
    const auto intended =
        deterministic_partner(round, view, node.id, unreachable_in_matching(table));
    // As RoundPeers builds it: the view's members, self included (the order does not matter).
    std::vector<PairingFacts> pairable = table.pairable_facts();
    const Member self = table.self();
    pairable.push_back(pairing_facts(self));
    std::erase_if(pairable, [](const PairingFacts& m) { return !m.proposable; });
    const uint64_t gap = config_.rounds.max_round_gap;
    auto candidates = random_candidates(pairable, node.id, round, gap,
                                        rs.book->recent_partners(round, kRecentPartnerRounds),
                                        rng_(), callable(self) || !config_.network.direct_first,
                                        heard_lately_since(pairable, heard_since));
    auto left_out = left_out_members(pairable, node.id, round, gap, rng_());
    rs.nonce = rng_();
    rs.view_digest = membership_digest(view);
    const auto intended_member = intended ? table.find(*intended) : std::nullopt;
    const bool ask_intended =
        intended_member && can_propose_to(*intended_member) && !done_with(*intended_member, round);
    rs.choice.emplace(PartnerChoice::Start{ask_intended ? intended : std::nullopt,
                                           std::move(candidates), std::move(left_out),
                                           clock_at(now), config_.rounds.pair_timeout});
    rs.book->open(round);
    if (!config_.rounds.overlap) {
        rs.stage = Stage::Choosing;
        return drive(n, now);
    }
    // The next phase starts now, beside the choice (and its exchange).
    ++rs.round;
    next_round(n, now);
    if (rs.choosing) drive(n, now);
}

void Simulation::drive(uint32_t n, Time now) {
    RoundState& rs = nodes_[n].rounds;
    for (;;) {
        const ChoiceStep step =
            rs.choice->next(clock_at(now), rs.book->partner(rs.choice_round).has_value());
        if (step.kind == ChoiceStep::Kind::Done) return finish_choice(n, now);
        if (step.kind == ChoiceStep::Kind::Listen)
            return schedule_choice(n, time_of(step.until), EventType::Listen);
        const auto to = index_of_.find(step.to);
        if (to == index_of_.end() || !rs.book->begin_proposal(rs.choice_round, step.to, rs.nonce)) {
            rs.choice->answered(rs.book->partner(rs.choice_round).has_value(), false);
            continue;
        }
        rs.proposing = true;
        rs.pair_call = next_call_++;
        Message pair{Kind::Pair, n, to->second, rs.pair_call, 0, false, {}, {}};
        pair.rounds.round = rs.choice_round;
        pair.rounds.nonce = rs.nonce;
        pair.rounds.mode = step.mode;
        pair.rounds.digest = step.mode == PairMode::Deterministic ? rs.view_digest : 0;
        send(std::move(pair), now);
        return schedule_choice(n, time_of(rs.choice->deadline()), EventType::PairTimeout);
    }
}

// RoundPeers::propose's end: the answer recorded, the choice told.
void Simulation::end_proposal(uint32_t n, bool accepted, bool ask_again, Time now) {
    RoundState& rs = nodes_[n].rounds;
    rs.proposing = false;
    rs.crossed = false;
    const auto partner = rs.book->end_proposal(rs.choice_round, accepted);
    rs.choice->answered(partner.has_value(), ask_again);
    drive(n, now);
}

void Simulation::finish_choice(uint32_t n, Time now) {
    Node& node = nodes_[n];
    RoundState& rs = node.rounds;
    const uint64_t round = rs.choice_round;
    rs.book->close(round);
    rs.choice.reset();
    rs.choosing = false;
    const auto partner = rs.book->partner(round);
    node.core->table().set_choice(round, partner.has_value());
    if (partner) node.core->table().note_round(*partner, round, clock_at(now));
    if (now >= warmup_) {
        ++figures_.choices;
        figures_.paired_choices += partner.has_value();
        if (node.unreachable) {
            ++figures_.private_choices;
            figures_.private_paired_choices += partner.has_value();
        }
        if (rs.last_choice >= Time{0}) round_seconds_.push_back(seconds(now - rs.last_choice));
        choice_seconds_.push_back(seconds(now - rs.choice_start));
    }
    rs.last_choice = now;
    if (rs.choices_since_join >= 0) {
        ++rs.choices_since_join;
        if (partner) {
            first_pair_rounds_.push_back(rs.choices_since_join);
            rs.choices_since_join = -1;
        }
    }
    if (!partner) {
        record_phi(round + 1, rs.phi);
        if (!config_.rounds.overlap) {
            ++rs.round;
            return next_round(n, now);
        }
        // A phase that ended while the choice went on chooses for its own round now.
        if (rs.stage == Stage::Landing) choose(n, now);
        return;
    }
    const uint32_t p = index_of_.at(*partner);
    rs.exchange = InFlight{round, p, rs.phi, false, 0};
    if (const auto early = rs.inbox.find(round);
        early != rs.inbox.end() && early->second.first == p) {
        rs.exchange->arrived = true;
        rs.exchange->partner_phi = early->second.second;
    }
    rs.inbox.erase(rs.inbox.begin(), rs.inbox.upper_bound(round));
    Message exchange{Kind::Exchange, n, p, next_call_++, 0, false, {}, {}};
    exchange.rounds.round = round;
    exchange.rounds.phi = rs.phi;
    send(std::move(exchange), now);
    schedule_at(now + config_.rounds.exchange_timeout, EventType::ExchangeTimeout, n, round);
    if (!config_.rounds.overlap) rs.stage = Stage::Exchanging;
    if (rs.exchange->arrived) land(n, now);
}

void Simulation::land(uint32_t n, Time now) {
    RoundState& rs = nodes_[n].rounds;
    const InFlight landed = *rs.exchange;
    rs.exchange.reset();
    if (landed.arrived) rs.phi = (landed.phi_sent + landed.partner_phi) / 2;
    record_phi(landed.round + 1, rs.phi);
    if (!config_.rounds.overlap) {
        ++rs.round;
        return next_round(n, now);
    }
    if (rs.stage == Stage::Landing) choose(n, now);
}

// RoundPeers::answer_pair: the caller must be a member this node lists alive; the PairingBook
// judges the rest against this node's own view.
void Simulation::answer_pair(const Message& m, Time now) {
    Node& node = nodes_[m.to];
    RoundState& rs = node.rounds;
    MemberTable& table = node.core->table();
    const uint64_t caller = nodes_[m.from].id;
    const RoundFields& asked = m.rounds;
    PairAnswer answer;
    const auto member = table.find(caller);
    if (!member) {
        answer.reason = "not a member this node knows";
    } else {
        table.note_round(caller, asked.round, clock_at(now));
        if (member->state != MemberState::Alive) {
            answer.reason = "not alive in this node's view";
        } else {
            const PairingView ours{table.self().round, [&] {
                                       const auto view = table.pairable_ids();
                                       return DeterministicView{
                                           membership_digest(view),
                                           deterministic_partner(asked.round, view, node.id,
                                                                 unreachable_in_matching(table))};
                                   }};
            answer = rs.book->consider({caller, asked.round, asked.nonce, asked.mode, asked.digest},
                                       ours);
        }
    }
    Message reply{Kind::PairAnswer, m.to, m.from, m.call, 0, false, {}, {}};
    reply.rounds.round = asked.round;
    reply.rounds.answer = answer;
    send(std::move(reply), now);
    // A node listening for proposals (or for the one that won over its own) takes the pairing.
    if (!answer.accepted || !rs.choosing || rs.choice_round != asked.round) return;
    if (rs.crossed) return end_proposal(m.to, false, false, now);
    if (!rs.proposing) {
        rs.choice_token = ++rs.next_token;  // the pause it was in ends here
        drive(m.to, now);
    }
}

void Simulation::request_state(uint32_t n, Time now) {
    RoundState& rs = nodes_[n].rounds;
    std::vector<uint32_t> donors;
    const MemberTable& table = nodes_[n].core->table();
    for (uint32_t i = 0; i < nodes_.size(); i++) {
        if (i == n || nodes_[i].status != Status::Up || nodes_[i].rounds.stage == Stage::Off ||
            nodes_[i].rounds.stage == Stage::Syncing)
            continue;
        // As PeerStateSync::fetch: live members that can be dialed.
        const auto member = table.find(nodes_[i].id);
        if (member && member->state == MemberState::Alive && callable(*member)) donors.push_back(i);
    }
    rs.stage = Stage::Syncing;
    rs.pair_call = next_call_++;
    if (!donors.empty())
        send({Kind::StateRequest,
              n,
              donors[std::uniform_int_distribution<size_t>(0, donors.size() - 1)(rng_)],
              rs.pair_call,
              0,
              false,
              {},
              {}},
             now);
    schedule_round(n, now + 3 * config_.rounds.exchange_timeout, EventType::PairTimeout);
}

// NodeRunner::copy_state_from_swarm's end: the copy's round and phi, what the copy cost, and the
// round to go on from (round_after_copy).
void Simulation::adopt_state(uint32_t n, uint64_t round, double phi, Time now) {
    RoundState& rs = nodes_[n].rounds;
    const auto median = median_training_round(heard_others(n, now));
    if (median && rs.median_before_copy)
        rs.copy_cost = *median > *rs.median_before_copy ? *median - *rs.median_before_copy : 0;
    rs.median_before_copy.reset();
    round = round_after_copy(median, round, config_.rounds.max_round_gap, true).value_or(round);
    start_rounds(n, now, round, phi);
}

void Simulation::answer_state(const Message& m, Time now) {
    const RoundState& donor = nodes_[m.to].rounds;
    if (donor.stage == Stage::Off || donor.stage == Stage::Syncing) return;
    Message reply{Kind::StateAnswer, m.to, m.from, m.call, 0, false, {}, {}};
    reply.rounds.round = donor.round;
    reply.rounds.phi = donor.phi;
    send(std::move(reply), now);
}

void Simulation::handle_round(Message& m, Time now) {
    const uint32_t n = m.to;
    RoundState& rs = nodes_[n].rounds;
    switch (m.kind) {
        case Kind::Pair: return answer_pair(m, now);
        case Kind::PairAnswer:
            if (!rs.choosing || !rs.proposing || rs.pair_call != m.call || rs.crossed) return;
            if (m.rounds.answer.crossed) {
                // Theirs wins the tiebreak: taken already, or on its way (waited for until the
                // deadline, as PairingBook::await_partner does).
                if (rs.book->partner(rs.choice_round)) return end_proposal(n, false, false, now);
                rs.crossed = true;
                return schedule_choice(n, time_of(rs.choice->deadline()), EventType::Listen);
            }
            return end_proposal(n, m.rounds.answer.accepted, m.rounds.answer.ask_again, now);
        case Kind::Exchange:
            if (rs.exchange && rs.exchange->round == m.rounds.round &&
                rs.exchange->partner == m.from && !rs.exchange->arrived) {
                rs.exchange->arrived = true;
                rs.exchange->partner_phi = m.rounds.phi;
                if (config_.rounds.overlap || rs.stage == Stage::Exchanging) land(n, now);
            } else if (m.rounds.round >= (rs.choosing ? rs.choice_round : rs.round)) {
                rs.inbox[m.rounds.round] = {m.from, m.rounds.phi};
            }
            return;
        case Kind::StateRequest: return answer_state(m, now);
        case Kind::StateAnswer:
            if (rs.stage != Stage::Syncing || rs.pair_call != m.call) return;
            if (now >= warmup_) ++figures_.state_copies;
            return adopt_state(n, m.rounds.round, m.rounds.phi, now);
        default: return;
    }
}

void Simulation::round_timer(const Event& event, Time now) {
    const uint32_t n = event.node;
    RoundState& rs = nodes_[n].rounds;
    if (event.type == EventType::ExchangeTimeout) {
        if (!rs.exchange || rs.exchange->round != event.call || rs.exchange->arrived) return;
        if (now >= warmup_) ++figures_.exchange_timeouts;
        return land(n, now);
    }
    const bool thread = event.call == rs.token, choice = event.call == rs.choice_token;
    switch (event.type) {
        case EventType::PhaseEnd:
            if (thread && rs.stage == Stage::Training) phase_end(n, now);
            return;
        case EventType::Listen:
            if (!choice || !rs.choosing) return;
            if (rs.crossed) return end_proposal(n, false, false, now);
            return drive(n, now);
        case EventType::PaceCheck:
            if (thread && rs.stage == Stage::Waiting) pace_check(n, now);
            return;
        case EventType::PairTimeout:
            if (thread && rs.stage == Stage::Syncing) return request_state(n, now);
            if (choice && rs.choosing && rs.proposing) end_proposal(n, false, false, now);
            return;
        default: return;
    }
}

void Simulation::finish_round_figures() {
    figures_.first_pair_rounds = spread_of(first_pair_rounds_);
    figures_.round_seconds = spread_of(round_seconds_);
    figures_.choice_seconds = spread_of(choice_seconds_);
    figures_.wait_seconds = spread_of(wait_seconds_);
    std::vector<uint64_t> rounds;
    for (const Node& node : nodes_) {
        if (node.status != Status::Up) continue;
        if (node.rounds.choices_since_join >= 0) {
            ++figures_.joiners_unpaired;
            figures_.unpaired_joiner_choices_max =
                std::max(figures_.unpaired_joiner_choices_max, node.rounds.choices_since_join);
        }
        if (node.rounds.stage != Stage::Off && node.rounds.stage != Stage::Syncing)
            rounds.push_back(node.rounds.round);
    }
    if (!rounds.empty()) {
        std::nth_element(rounds.begin(), rounds.begin() + rounds.size() / 2, rounds.end());
        figures_.rounds_median = rounds[rounds.size() / 2];
    }
    // Rounds 0, 1, 2, 5, 10, 20, 50, ...
    const auto next_mark = [](uint64_t r) {
        if (r < 2) return r + 1;
        uint64_t lead = r;
        while (lead >= 10) lead /= 10;
        return lead == 2 ? r / 2 * 5 : r * 2;
    };
    for (uint64_t r = 0; r < phi_sums_.size(); r = next_mark(r)) {
        const PhiSums& sums = phi_sums_[r];
        if (sums.count < config_.nodes / 2.0) break;
        const double mean = sums.sum / sums.count;
        figures_.phi_spread.push_back(
            {r, std::sqrt(std::max(0.0, sums.squares / sums.count - mean * mean))});
    }
}

}  // namespace starling::sim::internal
