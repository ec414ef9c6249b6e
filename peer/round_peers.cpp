#include "peer/round_peers.h"

#include <grpcpp/client_context.h>
#include <spdlog/spdlog.h>

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <set>
#include <thread>

#include "common/error.h"
#include "peer/identity.h"
#include "peer/partner_choice.h"
#include "peer/partners.h"
#include "peer/punched_channel.h"
#include "peer/round_pacing.h"
#include "peer/wire.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {

namespace {

// How long a private node's observed punch endpoint is used before it asks an anchor again.
constexpr std::chrono::seconds kPunchEndpointAge{60};

// How long an exchange through a relay waits for its agreement to be recorded (see await_relay).
constexpr std::chrono::seconds kAgreementWait{2};

// Whether the far end of a connection has closed it (its read side ended or it reset).
bool peer_hung_up(int fd) {
    pollfd p{fd, POLLRDHUP, 0};
    return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

RoundPeers::RoundPeers(const PeerConfig& config, const NodeIdentity& identity, MemberTable& table,
                       SwarmAuth& auth, PeerChannels& channels, FailureTally& failures,
                       AnchorHub& anchors, std::function<void(UniqueFd)> adopt_punched)
    : config_(config),
      identity_(identity),
      node_id_(table.self().node_id),
      table_(table),
      auth_(auth),
      channels_(channels),
      failures_(failures),
      anchors_(anchors),
      pairing_(node_id_, config.max_round_gap),
      deposits_(uint64_t{config.relay_limit_mib} << 20),
      relay_(config.relay_bytes_per_s),
      adopt_punched_(std::move(adopt_punched)) {}

RoundPeers::~RoundPeers() { stop(); }

void RoundPeers::advertise(uint64_t round) { table_.set_round(round); }

void RoundPeers::publish(uint64_t round, RoundMessage message) {
    message.signature = sign_round_message(identity_, round, *message.message, message.tokens);
    advertise(round);
    if (const Member self = table_.self(); self.reachability == Reachability::Private) {
        if (self.anchors.empty())
            spdlog::warn(
                "peer: round {}: this node cannot be dialed and holds no anchor yet, so no member "
                "can fetch its message",
                round);
        deposit(round, message, self.anchors);
    }
    messages_.publish(round, std::move(message));
}

void RoundPeers::deposit(uint64_t round, const RoundMessage& message,
                         const std::vector<uint64_t>& anchors) {
    MutexLock lock(deposits_mutex_);
    for (std::thread& thread : deposit_threads_) thread.join();
    deposit_threads_.clear();
    for (uint64_t anchor : anchors) {
        const auto member = table_.find(anchor);
        if (!running_ || !member) continue;
        deposit_threads_.emplace_back([this, round, message, anchor, address = member->address] {
            grpc::ClientContext context;
            context.set_deadline(std::chrono::system_clock::now() + config_.exchange_timeout);
            auth_.attach(context, "DepositRoundMessage");
            if (!exchanges_.track(context)) return;
            const std::string error = deposit_round_message(
                *v1::Peer::NewStub(channels_.get(address, ChannelUse::Exchange)), context, round,
                message);
            exchanges_.untrack(context);
            if (!error.empty())
                spdlog::warn("peer: round {}: anchor {} did not take this node's message: {}",
                             round, format_node_id(anchor), error);
        });
    }
}

void RoundPeers::forget_departed(const std::set<uint64_t>& members) {
    MutexLock lock(rates_mutex_);
    std::erase_if(exchange_bytes_per_s_,
                  [&](const auto& entry) { return !members.contains(entry.first); });
}

void RoundPeers::stop() {
    running_ = false;
    stopping_ = true;
    // The punches still running end outside the lock.
    std::map<std::pair<uint64_t, uint64_t>, AgreedRelay> agreed;
    std::vector<std::future<UniqueFd>> unfinished;
    {
        MutexLock lock(relays_mutex_);
        agreed.swap(relays_);
        unfinished.swap(unfinished_punches_);
    }
    agreed.clear();
    unfinished.clear();
    pairing_.stop();
    exchanges_.stop();
    relay_.stop();
    messages_.stop();
    deposits_.stop();
    MutexLock lock(deposits_mutex_);
    for (std::thread& thread : deposit_threads_) thread.join();
    deposit_threads_.clear();
}

grpc::Status RoundPeers::answer_round_message(uint64_t caller,
                                              const v1::FetchRoundMessageRequest& request,
                                              grpc::ServerWriter<v1::RoundMessageFrame>& writer) {
    const auto member = table_.find(caller);
    if (!member || !table_.compatible(*member))
        return {grpc::StatusCode::PERMISSION_DENIED,
                "node " + format_node_id(caller) + " is not a member of this model and swarm"};
    const auto deadline = SteadyClock::now() + config_.exchange_timeout;
    if (request.author() == 0 || request.author() == node_id_)
        return serve_round_message(messages_, request.round(), deadline, writer);
    return deposits_.serve(request.author(), anchors_.holds(request.author()), request.round(),
                           deadline, writer);
}

grpc::Status RoundPeers::answer_deposit(uint64_t caller,
                                        grpc::ServerReader<v1::DepositRoundMessageFrame>& reader) {
    const auto member = table_.find(caller);
    if (!member || !table_.compatible(*member))
        return {grpc::StatusCode::PERMISSION_DENIED,
                "node " + format_node_id(caller) + " is not a member of this model and swarm"};
    if (!anchors_.holds(caller))
        return {grpc::StatusCode::PERMISSION_DENIED,
                "node " + format_node_id(caller) + " holds no anchor stream to this node"};
    deposits_.keep_only([this](uint64_t author) { return anchors_.holds(author); });
    return deposits_.accept(caller, member->public_key, anchors_.streams(), reader);
}

std::optional<Member> RoundPeers::choose_partner(uint64_t round) {
    if (!running_) return std::nullopt;
    refresh_punch_endpoint();
    advertise(round);
    // The deterministic matching is over the whole view, which every member shares; a member this
    // node has quarantined is then neither proposed to nor asked.
    const auto view = table_.pairable_ids();
    const auto intended =
        deterministic_partner(round, view, node_id_, table_.private_pairable_ids());
    const Member self = table_.self();
    std::vector<PairingFacts> pairable;
    for (uint64_t id : view)
        if (const auto member = table_.find(id);
            member && can_propose_to(*member) && !scores_.quarantined(id, round))
            pairable.push_back(pairing_facts(*member));
    const auto candidates =
        random_candidates(pairable, node_id_, round, config_.max_round_gap,
                          pairing_.recent_partners(round, kRecentPartnerRounds), random_u64(),
                          callable(self), heard_lately_since(pairable, last_choice_));
    last_choice_ = SteadyClock::now();
    const auto left_out =
        left_out_members(pairable, node_id_, round, config_.max_round_gap, random_u64());
    if (!left_out.empty())
        spdlog::debug("peer: round {}: asking first {} member(s) left out of their last round",
                      round, left_out.size());
    // One nonce for all of this round's proposals, so crossing proposals settle the same way
    // however often they are repeated.
    const uint64_t nonce = random_u64();
    const uint64_t digest = membership_digest(view);
    // One budget for the whole choice (its deadline), so a round never waits on pairing longer
    // than pair_timeout however many proposals it takes.
    const auto intended_member = intended ? table_.find(*intended) : std::nullopt;
    const bool ask_intended = intended_member && can_propose_to(*intended_member) &&
                              !scores_.quarantined(*intended, round) &&
                              !done_with(*intended_member, round);
    PartnerChoice choice({ask_intended ? intended : std::nullopt, candidates, left_out,
                          SteadyClock::now(), config_.pair_timeout});
    pairing_.open(round);
    std::optional<uint64_t> partner;
    while (running_) {
        const ChoiceStep step = choice.next(SteadyClock::now(), partner.has_value());
        if (step.kind == ChoiceStep::Kind::Done) break;
        if (step.kind == ChoiceStep::Kind::Listen) {
            partner = pairing_.await_partner(round, step.until);
            continue;
        }
        const Proposal outcome =
            propose(round, step.to, step.mode, step.mode == PairMode::Deterministic ? digest : 0,
                    nonce, choice.deadline());
        partner = outcome.partner;
        choice.answered(partner.has_value(), outcome.ask_again);
    }
    pairing_.close(round);
    // A proposal may have been accepted between the last look and close().
    if (!partner) partner = pairing_.partner(round);
    // Said with this node's next digests: after a solo round the others ask it first
    // (left_out_members).
    table_.set_choice(round, partner.has_value());
    if (!partner) return std::nullopt;
    table_.note_round(*partner, round, SteadyClock::now());
    return table_.find(*partner);
}

RoundPeers::Proposal RoundPeers::propose(uint64_t round, uint64_t to, PairMode mode,
                                         uint64_t digest, uint64_t nonce,
                                         SteadyClock::time_point deadline) {
    const auto target = table_.find(to);
    if (!target || !pairing_.begin_proposal(round, to, nonce))
        return {pairing_.partner(round), false};
    v1::PairRequest request;
    request.set_round(round);
    request.set_nonce(nonce);
    request.set_membership_digest(digest);
    request.set_mode(mode == PairMode::Deterministic ? v1::PAIR_MODE_DETERMINISTIC
                                                     : v1::PAIR_MODE_RANDOM);
    if (proposes_relay(table_.self(), *target)) request.set_punch_endpoint(punch_endpoint_for(to));
    v1::PairResponse response;
    const auto allowed = deadline - SteadyClock::now();
    uint64_t via = 0;
    const auto status = callable(*target) ? call_pair(target->address, request, allowed, &response)
                                          : relay_pair(*target, request, allowed, &response, &via);
    count_if_cut_off(status, allowed);
    const bool accepted = status.ok() && response.accepted();
    if (accepted && via != 0) agree_relay(round, to, via, response.punch_endpoint());
    if (status.ok() && response.crossed()) {
        // Our proposal lost the tiebreak; theirs is on its way and we accept it on arrival.
        pairing_.await_partner(round, deadline);
    } else if (!accepted) {
        spdlog::debug("peer: node {} declined to pair for round {}: {}", format_node_id(to), round,
                      status.ok() ? response.reason() : status.error_message());
    }
    return {pairing_.end_proposal(round, accepted), status.ok() && response.ask_again()};
}

grpc::Status RoundPeers::call_pair(const std::string& address, const v1::PairRequest& request,
                                   SteadyClock::duration allowed, v1::PairResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + allowed);
    auth_.attach(context, "Pair");
    return v1::Peer::NewStub(channels_.get(address))->Pair(&context, request, response);
}

grpc::Status RoundPeers::relay_pair(const Member& target, const v1::PairRequest& request,
                                    SteadyClock::duration allowed, v1::PairResponse* response,
                                    uint64_t* via) {
    const auto deadline = SteadyClock::now() + allowed;
    v1::RelayPairRequest relayed;
    relayed.set_target_id(target.node_id);
    *relayed.mutable_pair() = request;
    const bool through_relay = proposes_relay(table_.self(), target);
    grpc::Status status{grpc::StatusCode::UNAVAILABLE,
                        "node " + format_node_id(target.node_id) + " names no anchor"};
    // Its anchors in turn, while time is left. One that lost its stream says so at once, one
    // that cannot be reached (killed, or gone from the network, and not yet known dead) fails
    // at once, and so does one named as the relay that relays nothing: the proposal went no
    // further than either, so the next anchor may carry it.
    for (const uint64_t id : target.anchors) {
        const auto left = deadline - SteadyClock::now();
        if (left <= SteadyClock::duration::zero()) break;
        if (id == node_id_) {  // this node holds the stream: no call to make
            auto answer =
                anchors_.pair(target.node_id, node_id_, request,
                              std::chrono::duration_cast<std::chrono::milliseconds>(left));
            if (!answer) continue;
            *response = std::move(*answer);
            return grpc::Status::OK;
        }
        const auto anchor = table_.find(id);
        if (!anchor || anchor->state != MemberState::Alive) continue;
        if (through_relay) relayed.mutable_pair()->set_relay(id);
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + left);
        auth_.attach(context, "RelayPair");
        status = v1::Peer::NewStub(channels_.get(anchor->address))
                     ->RelayPair(&context, relayed, response);
        if (status.ok() && through_relay && via) *via = id;
        if (status.ok() || (status.error_code() != grpc::StatusCode::NOT_FOUND &&
                            status.error_code() != grpc::StatusCode::UNAVAILABLE &&
                            status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED))
            break;
    }
    return status;
}

grpc::Status RoundPeers::answer_pair(uint64_t caller, const v1::PairRequest& request,
                                     v1::PairResponse* response) {
    const auto member = table_.find(caller);
    if (!member || caller == node_id_)
        return {grpc::StatusCode::PERMISSION_DENIED,
                "node " + format_node_id(caller) + " is not a member this node knows"};
    if (!table_.compatible(*member))
        return {grpc::StatusCode::PERMISSION_DENIED,
                "node " + format_node_id(caller) +
                    " runs another model, protocol or swarm and is never paired"};
    if (request.mode() == v1::PAIR_MODE_CONFIRM) {
        const bool ours = paired_with(request.round(), caller);
        response->set_accepted(ours);
        if (!ours)
            response->set_reason("node " + format_node_id(node_id_) + " is not paired with node " +
                                 format_node_id(caller) + " for round " +
                                 std::to_string(request.round()));
        return grpc::Status::OK;
    }
    if (request.mode() != v1::PAIR_MODE_DETERMINISTIC && request.mode() != v1::PAIR_MODE_RANDOM)
        return {grpc::StatusCode::INVALID_ARGUMENT, "unknown pair mode"};
    table_.note_round(caller, request.round(),
                      SteadyClock::now());  // it is choosing for this round: it is there
    PairAnswer answer;
    std::string endpoint;  // this node's punch port, for a proposer that gave its own
    if (scores_.quarantined(caller, request.round())) {
        answer.reason = "node " + format_node_id(node_id_) + " does not pair with node " +
                        format_node_id(caller) + " for now: it refused its messages";
    } else if (member->state != MemberState::Alive) {
        answer.reason = "node " + format_node_id(caller) + " is " +
                        member_state_name(member->state) + " in this node's view";
    } else {
        const PairMode mode = request.mode() == v1::PAIR_MODE_DETERMINISTIC
                                  ? PairMode::Deterministic
                                  : PairMode::Random;
        const PairingView ours{table_.self().round, [&] {
                                   const auto view = table_.pairable_ids();
                                   return DeterministicView{
                                       membership_digest(view),
                                       deterministic_partner(request.round(), view, node_id_,
                                                             table_.private_pairable_ids())};
                               }};
        const Member self = table_.self();
        const auto& anchors = self.anchors;
        const bool names_anchor =
            std::find(anchors.begin(), anchors.end(), request.relay()) != anchors.end();
        if (std::string refusal = path_refusal(self, *member, request.relay(), names_anchor);
            !refusal.empty()) {
            answer.reason = std::move(refusal);
        } else {
            answer = pairing_.consider(
                {caller, request.round(), request.nonce(), mode, request.membership_digest()},
                ours);
            // The agreement, not this node's view of the proposer at the exchange, decides the
            // path: both sides then take the same one.
            if (answer.accepted && request.relay() != 0) {
                // Both punch only where both endpoints are known, so neither waits on the other.
                if (!request.punch_endpoint().empty()) endpoint = punch_endpoint_for(caller);
                agree_relay(request.round(), caller, request.relay(),
                            endpoint.empty() ? "" : request.punch_endpoint());
            }
        }
    }
    response->set_accepted(answer.accepted);
    response->set_crossed(answer.crossed);
    response->set_ask_again(answer.ask_again);
    response->set_reason(answer.reason);
    response->set_punch_endpoint(endpoint);
    return grpc::Status::OK;
}

bool RoundPeers::paired_with(uint64_t round, uint64_t caller) {
    // The caller may be a step ahead: it accepted our proposal and called before our side of the
    // RPC recorded the answer.
    if (!pairing_.partner(round) && pairing_.proposing_to(round, caller))
        pairing_.await_partner(round, SteadyClock::now() + config_.probe_timeout);
    return pairing_.partner(round) == caller;
}

bool RoundPeers::confirm_pairing(uint64_t round, const Member& partner,
                                 SteadyClock::time_point deadline, std::string* why) {
    v1::PairRequest request;
    request.set_round(round);
    request.set_mode(v1::PAIR_MODE_CONFIRM);
    v1::PairResponse response;
    grpc::ClientContext context;
    const auto allowed =
        std::min<SteadyClock::duration>(deadline - SteadyClock::now(), config_.probe_timeout * 4);
    context.set_deadline(std::chrono::system_clock::now() + allowed);
    auth_.attach(context, "Pair");
    const auto status =
        v1::Peer::NewStub(channels_.get(partner.address))->Pair(&context, request, &response);
    count_if_cut_off(status, allowed);
    if (status.ok() && response.accepted()) return true;
    *why =
        status.ok() ? response.reason() : "cannot confirm the pairing: " + status.error_message();
    return false;
}

grpc::Status RoundPeers::answer_exchange(grpc::ServerContext& context, ExchangeServerStream& stream,
                                         uint64_t caller) {
    ExchangeWireFrame first;
    if (!stream.Read(&first))
        return {grpc::StatusCode::INVALID_ARGUMENT, "the stream ended before its first frame"};
    const uint64_t round = first.fields.round();
    // At once, not after T_xchg: a caller that believes itself paired when this node does not
    // (an acceptance whose answer was lost, this node restarted) goes solo now.
    if (!paired_with(round, caller))
        return {grpc::StatusCode::PERMISSION_DENIED, "node " + format_node_id(caller) +
                                                         " is not this node's partner for round " +
                                                         std::to_string(round)};
    return exchanges_.answer(context, stream, caller, first,
                             SteadyClock::now() + config_.exchange_timeout);
}

grpc::Status RoundPeers::answer_relay_exchange(grpc::ServerContext& context,
                                               ExchangeServerStream& stream, uint64_t caller) {
    const auto& metadata = context.client_metadata();
    const auto named = metadata.find(kRelayToMetadata);
    const auto partner_id =
        named == metadata.end()
            ? std::nullopt
            : parse_node_id(std::string(named->second.data(), named->second.size()));
    if (!partner_id)
        return {grpc::StatusCode::INVALID_ARGUMENT,
                std::string("a relayed exchange names its partner in ") + kRelayToMetadata};
    // A relay passes frames it never decodes: the two must be members, of any model.
    const auto member = table_.find(caller);
    const auto partner = table_.find(*partner_id);
    if (!member || !partner)
        return {grpc::StatusCode::PERMISSION_DENIED, "nodes " + format_node_id(caller) + " and " +
                                                         format_node_id(*partner_id) +
                                                         " are not both members this node knows"};
    // One of the two must be a member this node anchors. The other's reachability is not asked:
    // the pairing agreed the relay, maybe while a verdict was pending, and a public member paired
    // so costs the relay no more than a private one (the rate cap and the limit of exchanges
    // hold for all).
    if (!anchors_.holds(caller) && !anchors_.holds(*partner_id))
        return {grpc::StatusCode::PERMISSION_DENIED, "this node anchors neither node " +
                                                         format_node_id(caller) + " nor node " +
                                                         format_node_id(*partner_id)};
    return relay_.serve(context, stream, caller, *partner_id,
                        SteadyClock::now() + config_.exchange_timeout);
}

void RoundPeers::agree_relay(uint64_t round, uint64_t partner, uint64_t relay,
                             const std::string& partner_endpoint) {
    // One agreement at a time, so that one agreed again (a repeated proposal, or the partner's
    // crossing one) finds the first one's punch, which is the one the partner's connects meet.
    MutexLock agreeing(agreeing_mutex_);
    bool punching = false;
    {
        MutexLock lock(relays_mutex_);
        const auto it = relays_.find({round, partner});
        punching = it != relays_.end() && it->second.punching;
    }
    // Started before it is recorded: an exchange that finds the relay finds the punch with it.
    std::future<UniqueFd> punch =
        punching ? std::future<UniqueFd>{} : start_punch(partner, partner_endpoint);
    std::vector<std::future<UniqueFd>> dropped;  // waited for (a punch still running) unlocked
    MutexLock lock(relays_mutex_);
    std::erase_if(unfinished_punches_, [&](std::future<UniqueFd>& unfinished) {
        if (unfinished.wait_for(std::chrono::seconds(0)) != std::future_status::ready) return false;
        dropped.push_back(std::move(unfinished));
        return true;
    });
    // Kept by round and partner: a second agreement in one round (which the pairing should not
    // make) must not take the first one's place, or that partner's exchange finds no relay.
    const auto earlier = relays_.lower_bound({round, 0});
    if (earlier != relays_.end() && earlier->first.first == round &&
        earlier->first.second != partner)
        spdlog::info("peer: round {}: a relay agreed with node {} after one with node {}", round,
                     format_node_id(partner), format_node_id(earlier->first.second));
    // Agreed again: the newer relay, as both sides record their agreements in the same order.
    AgreedRelay& agreed = relays_[{round, partner}];
    agreed.relay = relay;
    if (punch.valid()) {
        agreed.punch = std::move(punch);
        agreed.punching = true;
    }
    while (relays_.begin()->first.first + PairingBook::kRoundsKept <= round) {
        dropped.push_back(std::move(relays_.begin()->second.punch));
        relays_.erase(relays_.begin());
    }
    relay_recorded_.notify_all();
}

std::optional<uint64_t> RoundPeers::await_relay(uint64_t round, uint64_t partner,
                                                SteadyClock::time_point until) {
    MutexLock lock(relays_mutex_);
    lock.wait_until(relay_recorded_, until, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(relays_mutex_) {
        return relays_.contains({round, partner});
    });
    const auto it = relays_.find({round, partner});
    if (it == relays_.end()) return std::nullopt;
    return it->second.relay;
}

std::optional<uint64_t> RoundPeers::relay_for(uint64_t round, uint64_t partner) const {
    MutexLock lock(relays_mutex_);
    const auto it = relays_.find({round, partner});
    if (it == relays_.end()) return std::nullopt;
    return it->second.relay;
}

std::future<UniqueFd> RoundPeers::take_punch(uint64_t round, uint64_t partner) {
    MutexLock lock(relays_mutex_);
    const auto it = relays_.find({round, partner});
    return it == relays_.end() ? std::future<UniqueFd>{} : std::move(it->second.punch);
}

std::future<UniqueFd> RoundPeers::start_punch(uint64_t partner, const std::string& endpoint) {
    if (endpoint.empty()) return {};
    std::shared_ptr<PunchPort> port;
    {
        MutexLock lock(punch_mutex_);
        if (punch_endpoint_.empty()) return {};
        port = punch_port_;
    }
    if (!port) return {};
    const auto deadline = SteadyClock::now() + config_.punch_timeout;
    try {
        return std::async(std::launch::async, [this, port, endpoint, partner, deadline] {
            return port->punch(endpoint, node_id_, partner, deadline, &stopping_);
        });
    } catch (const std::system_error& e) {
        spdlog::warn("peer: no thread to punch a hole to node {}, exchanging through the relay: {}",
                     format_node_id(partner), e.what());
        return {};
    }
}

std::string RoundPeers::punch_endpoint_for(uint64_t partner) {
    MutexLock lock(punch_mutex_);
    return punch_failures_.may_punch(partner, SteadyClock::now()) ? punch_endpoint_ : "";
}

void RoundPeers::refresh_punch_endpoint() {
    const Member self = table_.self();
    if (!config_.hole_punch || !adopt_punched_ || callable(self) || self.anchors.empty()) return;
    std::shared_ptr<PunchPort> port;
    {
        MutexLock lock(punch_mutex_);
        const auto now = SteadyClock::now();
        if (punch_observed_ && now - *punch_observed_ < kPunchEndpointAge) return;
        punch_observed_ = now;  // one try a minute, whatever comes of it
        if (!punch_port_) {
            try {
                punch_port_ = std::make_shared<PunchPort>();
            } catch (const Error& e) {
                spdlog::warn("peer: no port for hole punching, private pairs use relays: {}",
                             e.what());
                return;
            }
        }
        port = punch_port_;
    }
    std::string problems;
    for (const uint64_t id : self.anchors) {
        const auto anchor = table_.find(id);
        if (!anchor || anchor->state != MemberState::Alive) continue;
        try {
            std::string seen = port->observe(anchor->address, config_.probe_timeout);
            MutexLock lock(punch_mutex_);
            if (seen != punch_endpoint_)
                spdlog::info("peer: node {} sees this node's hole-punch port {} as {}",
                             format_node_id(id), port->port(), seen);
            punch_endpoint_ = std::move(seen);
            return;
        } catch (const Error& e) {
            problems += std::string(problems.empty() ? "" : "; ") + e.what();
        }
    }
    spdlog::debug("peer: where this node's hole-punch port is seen is not known: {}",
                  problems.empty() ? "no anchor alive" : problems);
}

std::optional<ExchangeResult> RoundPeers::exchange_punched(ExchangeSlot& slot,
                                                           const Member& partner,
                                                           std::future<UniqueFd> punch,
                                                           SteadyClock::time_point deadline) {
    // An exchange that starts as the two pair waits for the punch's end, at most a third of its
    // budget; a punch still trying then is left to end on its own.
    const auto failed = [&](const std::string& why) {
        ++failed_hole_punches_;
        {
            MutexLock lock(punch_mutex_);
            punch_failures_.failed(slot.partner, SteadyClock::now());
        }
        spdlog::info(
            "peer: round {}: no direct connection to node {}, exchanging through the relay (no "
            "punch to it for {} min): {}",
            slot.round, format_node_id(slot.partner), PunchFailures::kRetryAfter.count(), why);
        return std::nullopt;
    };
    const auto now = SteadyClock::now();
    if (punch.wait_until(now + (deadline - now) / 3) != std::future_status::ready) {
        {
            MutexLock lock(relays_mutex_);
            unfinished_punches_.push_back(std::move(punch));
        }
        return failed("the punch was still trying at a third of the exchange's budget");
    }
    UniqueFd connection;
    try {
        connection = punch.get();
    } catch (const Error& e) {
        return failed(e.what());
    }
    ++hole_punches_;
    ExchangeResult result;
    bool unused = false;  // nothing went over the connection: the relay carries the exchange
    if (opens_exchange(table_.self(), partner)) {
        std::optional<PunchedChannel> channel;
        try {
            channel.emplace(std::move(connection), channels_.credentials(),
                            channels_.exchange_arguments(partner.address));
        } catch (const Error& e) {
            spdlog::warn("peer: round {}: {}; exchanging through the relay", slot.round, e.what());
            return std::nullopt;
        }
        result = open_tracked_exchange(channel->channel(), slot, deadline);
        unused = !result.error.empty() && result.bytes_sent == 0 && result.bytes_received == 0;
    } else {
        // The partner opens the exchange over the connection: the peer port's server takes this
        // end. A duplicate tells whether the partner hung up instead (and went to the relay).
        const UniqueFd watch(::fcntl(connection.get(), F_DUPFD_CLOEXEC, 0));
        adopt_punched_(std::move(connection));
        bool hung_up = false;
        result = exchanges_.serve(slot, deadline, [&] {
            const auto now_known = table_.find(slot.partner);
            hung_up = watch && peer_hung_up(watch.get());
            return hung_up || !now_known || now_known->state == MemberState::Dead ||
                   now_known->state == MemberState::Left;
        });
        unused = hung_up && result.bytes_sent == 0 && result.bytes_received == 0;
    }
    if (unused) {
        spdlog::info(
            "peer: round {}: the connection punched to node {} carried nothing ({}), "
            "exchanging through the relay",
            slot.round, format_node_id(slot.partner), result.error);
        return std::nullopt;
    }
    ++punched_exchanges_;
    return result;
}

ExchangeResult RoundPeers::open_tracked_exchange(const std::shared_ptr<grpc::Channel>& channel,
                                                 ExchangeSlot& slot,
                                                 SteadyClock::time_point deadline,
                                                 ExchangeMethod method) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + (deadline - SteadyClock::now()));
    const bool relayed = method == ExchangeMethod::RelayExchange;
    if (relayed) context.AddMetadata(kRelayToMetadata, format_node_id(slot.partner));
    auth_.attach(context, relayed ? "RelayExchange" : "Exchange");
    if (!exchanges_.track(context)) return exchange_failed("this node is stopping");
    auto result = open_exchange(channel, context, slot, method);
    exchanges_.untrack(context);
    return result;
}

ExchangeResult RoundPeers::exchange_through_relay(ExchangeSlot& slot, uint64_t relay_id,
                                                  SteadyClock::time_point deadline) {
    const auto relay = table_.find(relay_id);
    if (!relay || relay->state == MemberState::Dead || relay->state == MemberState::Left)
        return exchange_failed("its relay, node " + format_node_id(relay_id) + ", is gone");
    ++exchanges_through_relay_;
    auto result = open_tracked_exchange(channels_.get(relay->address, ChannelUse::Exchange), slot,
                                        deadline, ExchangeMethod::RelayExchange);
    if (!result.error.empty())
        result.error = "through relay " + format_node_id(relay_id) + ": " + result.error;
    return result;
}

void RoundPeers::judged(uint64_t member, uint64_t round,
                        const std::optional<std::string>& refusal) {
    if (!refusal) {
        scores_.accepted(member);
        return;
    }
    const auto quarantine = scores_.refused(member, round, *refusal);
    if (!quarantine) return;
    const auto found = table_.find(member);
    spdlog::warn(
        "peer: node {} ({}) quarantined until round {} ({} rounds, quarantine {}): {} of its "
        "last {} messages refused ({} refused, {} accepted in all), the last: {}",
        format_node_id(member), found ? found->address : "address unknown", quarantine->until_round,
        quarantine->rounds, quarantine->score.quarantines, quarantine->score.refused_lately,
        quarantine->score.judged_lately, quarantine->score.refused, quarantine->score.accepted,
        *refusal);
}

std::vector<uint64_t> RoundPeers::quarantined() const {
    return scores_.quarantined_in(table_.self().round);
}

void RoundPeers::count_if_cut_off(const grpc::Status& status, SteadyClock::duration allowed) {
    if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
        allowed >= config_.probe_timeout)
        failures_.count(FailureReason::Timeout);
}

std::chrono::milliseconds RoundPeers::exchange_budget_with(uint64_t partner, uint64_t bytes) const {
    std::optional<double> measured;
    {
        MutexLock lock(rates_mutex_);
        if (const auto it = exchange_bytes_per_s_.find(partner); it != exchange_bytes_per_s_.end())
            measured = it->second;
    }
    return exchange_budget(bytes, measured, config_.min_link_bytes_per_s, config_.exchange_timeout,
                           config_.exchange_timeout_max);
}

ExchangeResult RoundPeers::exchange(ExchangeSlot slot) {
    const auto started = SteadyClock::now();
    const auto deadline = slot.deadline.value_or(started + config_.exchange_timeout);
    ExchangeResult result = [&] {
        if (!running_) return exchange_failed("this node is not running");
        if (pairing_.partner(slot.round) != slot.partner)
            return exchange_failed("not this node's partner for the round");
        const auto partner = table_.find(slot.partner);
        if (!partner) return exchange_failed("not a member this node knows");
        slot.author = &identity_;
        slot.partner_key = partner->public_key;
        auto relay = relay_for(slot.round, slot.partner);
        if (!relay && needs_relay(table_.self(), *partner))
            // Paired by accepting the partner's proposal, which this node's server records with
            // its relay a moment after the choice sees the pairing.
            relay = await_relay(slot.round, slot.partner,
                                std::min(deadline, SteadyClock::now() + kAgreementWait));
        if (relay) {
            if (auto punch = take_punch(slot.round, slot.partner); punch.valid())
                if (auto punched = exchange_punched(slot, *partner, std::move(punch), deadline))
                    return std::move(*punched);
            return exchange_through_relay(slot, *relay, deadline);
        }
        if (needs_relay(table_.self(), *partner))
            return exchange_failed("no relay was agreed with the partner for the round");
        if (!opens_exchange(table_.self(), *partner)) {
            // The partner's stream is awaited only once the partner says it holds the pairing too,
            // where it can be asked: a partner members cannot dial is waited for, up to the
            // deadline.
            std::string why;
            if (callable(*partner) && !confirm_pairing(slot.round, *partner, deadline, &why))
                return exchange_failed(why);
            return exchanges_.serve(slot, deadline, [&] {
                const auto now = table_.find(slot.partner);
                return !now || now->state == MemberState::Dead || now->state == MemberState::Left;
            });
        }
        return open_tracked_exchange(channels_.get(partner->address, ChannelUse::Exchange), slot,
                                     deadline);
    }();
    const bool whole = result.received && result.delivered;
    if (result.partner_header_at &&
        (whole || (result.bytes_received > 0 && SteadyClock::now() >= deadline))) {
        // The rate this link gave from the partner's header on, when both sides were there: the
        // time before it is the partner's lateness, not the link's, and counting it gave budgets
        // of twice the timeout after one late partner, which the next partner that never came
        // then cost in full. A transfer its deadline cut off counts too, so a link slower than
        // min_link_bytes_per_s gets the time it needs from the next round on, but only by what
        // arrived: bytes sent may lie in buffers. One that failed early for another reason, or
        // in which the partner sent nothing, says nothing about the link.
        const uint64_t moved =
            whole ? std::max(result.bytes_sent, result.bytes_received) : result.bytes_received;
        const double seconds = std::max(
            std::chrono::duration<double>(SteadyClock::now() - *result.partner_header_at).count(),
            1e-3);
        MutexLock lock(rates_mutex_);
        exchange_bytes_per_s_[slot.partner] = static_cast<double>(moved) / seconds;
    }
    if (result.refused) {
        failures_.count(FailureReason::RefusedMessage);
        judged(slot.partner, slot.round, result.error);
    } else if (!whole && SteadyClock::now() >= deadline) {
        failures_.count(FailureReason::Timeout);
    }
    if (!result.error.empty())
        result.error = "exchange with node " + format_node_id(slot.partner) + " for round " +
                       std::to_string(slot.round) + ": " + result.error;
    return result;
}

std::vector<RoundPeers::Gathered> RoundPeers::gather(
    uint64_t round, std::span<const uint64_t> members,
    std::span<codec::MessageDecoder* const> decoders, uint64_t* bytes) {
    using namespace std::chrono_literals;
    const auto deadline = std::chrono::system_clock::now() + config_.exchange_timeout;
    std::vector<Gathered> gathered(members.size());
    std::vector<uint64_t> read(members.size(), 0);
    std::vector<std::thread> fetches;
    for (size_t i = 0; i < members.size(); i++) {
        fetches.emplace_back([&, i] {
            // A call that never reached a member still listed alive is tried again until the
            // deadline: one refused connection must not leave a live member's D out of the mean,
            // which would part this node's phi from those of the members that got it.
            // A private member's message is fetched from its anchors in turn, one of which may
            // not hold it; once as many have said they hold none as it names, none will: the
            // round is past there, or refused. Asking on until the deadline would keep a node
            // that is a round behind the others a whole exchange timeout late every round, and
            // behind for good.
            size_t absent_at_anchors = 0;
            for (auto [pause, attempt] = std::pair{50ms, size_t{0}};;
                 pause = std::min<std::chrono::milliseconds>(2 * pause, 500ms), ++attempt) {
                const auto member = table_.find(members[i]);
                if (!running_ || !member) {
                    gathered[i].error = "not a member this node knows";
                    return;
                }
                const std::string source = round_message_source(*member, attempt);
                if (source.empty()) {
                    gathered[i].error = "it cannot be dialed and names no anchor this node knows";
                    return;
                }
                grpc::ClientContext context;
                context.set_deadline(deadline);
                auth_.attach(context, "FetchRoundMessage");
                if (!exchanges_.track(context)) {
                    gathered[i].error = "this node is stopping";
                    return;
                }
                const FetchedRoundMessage fetched = fetch_round_message(
                    *v1::Peer::NewStub(channels_.get(source, ChannelUse::Exchange)), context, round,
                    members[i], member->public_key, *decoders[i], &read[i]);
                exchanges_.untrack(context);
                gathered[i] = {fetched.error, fetched.tokens};
                if (fetched.refused) failures_.count(FailureReason::RefusedMessage);
                if (fetched.timed_out) failures_.count(FailureReason::Timeout);
                const auto now = table_.find(members[i]);
                const bool gone =
                    !now || now->state == MemberState::Dead || now->state == MemberState::Left;
                const bool via_anchor = source != member->address;
                if (via_anchor && fetched.absent) absent_at_anchors++;
                const bool other_anchor_may_hold =
                    via_anchor && fetched.absent && absent_at_anchors < member->anchors.size();
                if (!(fetched.unreachable || other_anchor_may_hold) || gone ||
                    std::chrono::system_clock::now() + pause >= deadline)
                    return;
                std::this_thread::sleep_for(pause);
            }
        });
    }
    for (auto& fetch : fetches) fetch.join();
    for (size_t i = 0; i < members.size(); i++) {
        *bytes += read[i];
        std::string& error = gathered[i].error;
        if (!error.empty())
            error = "round " + std::to_string(round) + " message of node " +
                    format_node_id(members[i]) + ": " + error;
    }
    return gathered;
}

std::string RoundPeers::round_message_source(const Member& member, size_t attempt) const {
    if (member.reachability != Reachability::Private) return member.address;
    if (member.anchors.empty()) return "";
    // Each fetcher starts at an anchor of its own, so the anchors share the serving.
    const auto anchor = table_.find(member.anchors[(node_id_ + attempt) % member.anchors.size()]);
    return anchor ? anchor->address : "";
}

}  // namespace starling
