#include "peer/membership_protocol.h"

#include <grpcpp/client_context.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <future>
#include <sstream>

#include "common/atomic_file.h"
#include "common/error.h"
#include "peer/address.h"
#include "peer/identity.h"
#include "peer/wire.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {
namespace {

void set_deadline(grpc::ClientContext& context, std::chrono::milliseconds timeout) {
    context.set_deadline(std::chrono::system_clock::now() + timeout);
}

// Merges every usable digest; an unusable one is logged with its reason and skipped. A gossip
// message and a join's answer carry their sender's own digest first (`first_is_sender`): that
// member is heard from (MemberTable::heard_from).
template <typename Digests>
void merge_all(SwimCore& swim, const Digests& digests, size_t limit, const char* source,
               bool first_is_sender) {
    MemberTable& table = swim.table();
    const auto now = SteadyClock::now();
    size_t taken = 0;
    for (const auto& digest : digests) {
        const bool from_sender = first_is_sender && taken == 0;
        if (taken++ == limit) break;
        auto parsed = from_digest(digest);
        if (auto* why = std::get_if<std::string>(&parsed)) {
            spdlog::debug("peer: dropped a member digest from {}: {}", source, *why);
            continue;
        }
        const Member& member = std::get<Member>(parsed);
        const std::optional<MemberState> before = table.state_of(member.node_id);
        const auto result = swim.merge(member, now);
        if (from_sender) table.heard_from(member.node_id, now);
        // Once here or once through expire(): each node logs each death it learns of, so when
        // a crash is known to all can be read from the logs (bench/swarm_scale).
        if (result == MemberTable::Merge::Updated && member.state == MemberState::Dead &&
            (before == MemberState::Alive || before == MemberState::Suspect))
            spdlog::info("peer: node {} reported dead", format_node_id(member.node_id));
        if (result == MemberTable::Merge::Added) {
            spdlog::info("peer: member {} at {} ({})", format_node_id(member.node_id),
                         member.address, member_state_name(member.state));
            if (const std::string why = incompatibility(member, table.self()); !why.empty())
                spdlog::warn("peer: node {} at {} {}: it is never paired with this node",
                             format_node_id(member.node_id), member.address, why);
        } else if (result == MemberTable::Merge::Refuted)
            spdlog::info("peer: refuted a report of this node as {}",
                         member_state_name(member.state));
        else if (result == MemberTable::Merge::Duplicate)
            spdlog::error(
                "peer: another live process at {} uses this node's key (node {}); give every node its "
                "own data directory",
                member.address, format_node_id(member.node_id));
    }
}

template <typename Message>
void fill_members(const std::vector<Member>& members, Message* message) {
    for (const Member& m : members) to_digest(m, message->add_members());
}

}  // namespace

MembershipProtocol::MembershipProtocol(const PeerConfig& config, Member self, SwarmAuth& auth,
                                       PeerChannels& channels, FailureTally& failures,
                                       AnchorHub& anchors)
    : config_(config),
      auth_(auth),
      channels_(channels),
      failures_(failures),
      anchors_(anchors),
      swim_(std::move(self), config.membership, config.swim, random_u64()),
      seeds_(config.gossip_interval, config.join_backoff_max) {}

void MembershipProtocol::set_address(const std::string& address) {
    address_ = address;
    table().set_address(address);
}

void MembershipProtocol::join_first(const std::vector<std::string>& config_seeds) {
    std::vector<std::string> seeds = config_seeds;
    if (!config_.data_dir.empty()) {
        std::error_code ec;
        if (std::filesystem::exists(config_.data_dir / "peers.txt", ec)) {
            std::istringstream lines(read_file(config_.data_dir / "peers.txt"));
            for (std::string line; std::getline(lines, line);)
                if (parse_host_port(line)) seeds.push_back(line);
        }
    }
    for (const auto& seed : seeds)
        if (seed != address_) seeds_.add(seed);
    const std::vector<std::string> first_tries = seeds_.seeds();
    for (const auto& seed : first_tries) {
        std::string why;
        const auto result = try_join(seed, &why);
        if (result == JoinResult::Duplicate)
            throw Error("cannot start: " + why +
                        "; two nodes share one key: give each node its own data directory");
        if (result == JoinResult::Joined) break;
    }
    if (!first_tries.empty() && table().reachable_others().empty())
        spdlog::warn("peer: no seed answered; running alone and retrying with backoff");
}

void MembershipProtocol::add_seeds(const std::vector<std::string>& seeds) {
    for (const auto& seed : seeds)
        if (!parse_host_port(seed)) throw Error("'" + seed + "' is not host:port");
    for (const auto& seed : seeds) seeds_.add(seed);
}

std::vector<std::string> MembershipProtocol::join_seeds(const std::vector<std::string>& seeds,
                                                        SteadyClock::time_point by) {
    std::vector<std::future<std::string>> tries;
    for (const std::string& seed : seeds)
        tries.push_back(std::async(std::launch::async, [this, seed, by]() -> std::string {
            std::string why;
            switch (try_join(seed, &why, by)) {
                case JoinResult::Joined: return "";
                case JoinResult::Self: return "it is this node's own address";
                case JoinResult::Unreachable: return why.empty() ? "no answer" : why;
                case JoinResult::Duplicate: return why;
            }
            return why;
        }));
    std::vector<std::string> problems, joined;
    for (size_t i = 0; i < seeds.size(); i++) {
        problems.push_back(tries[i].get());
        if (problems.back().empty()) {
            joined.push_back(seeds[i]);
        } else {
            spdlog::warn("peer: cannot join through seed {}: {}; not kept", seeds[i],
                         problems.back());
        }
    }
    if (!joined.empty()) add_seeds(joined);
    return problems;
}

MembershipProtocol::JoinResult MembershipProtocol::try_join(const std::string& seed,
                                                            std::string* why,
                                                            SteadyClock::time_point by) {
    const std::vector<std::string> targets = config_.resolve_seed(seed);
    if (targets.size() <= 1) return join_through(seed, channels_.get(seed), why, by);
    // A name for several members (a headless service): any of them will do, but one may be this
    // node.
    size_t self = 0;
    for (const std::string& target : targets) {
        const JoinResult result =
            join_through(seed + " at " + target, channels_.to_seed_address(target, seed), why, by);
        if (result == JoinResult::Joined || result == JoinResult::Duplicate) return result;
        if (result == JoinResult::Self) ++self;
    }
    return self == targets.size() ? JoinResult::Self : JoinResult::Unreachable;
}

MembershipProtocol::JoinResult MembershipProtocol::join_through(
    const std::string& seed, const std::shared_ptr<grpc::Channel>& channel, std::string* why,
    SteadyClock::time_point by) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(by - SteadyClock::now());
    if (left <= std::chrono::milliseconds(0)) {
        *why = "no time was left to dial it";
        return JoinResult::Unreachable;
    }
    v1::JoinRequest request;
    to_digest(table().self(), request.mutable_joiner());
    v1::JoinResponse response;
    grpc::ClientContext context;
    set_deadline(context, std::min(config_.probe_timeout * 4, left));
    auth_.attach(context, "Join");
    count_sent(request);
    const auto status = v1::Peer::NewStub(channel)->Join(&context, request, &response);
    if (status.error_code() == grpc::StatusCode::ALREADY_EXISTS) {
        *why = "seed " + seed + " says " + status.error_message();
        return JoinResult::Duplicate;
    }
    if (status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
        *why = "seed " + seed + " is this node";
        spdlog::debug("peer: {}", *why);
        return JoinResult::Self;
    }
    if (!status.ok()) {
        const bool refused_tls = refused_in_tls_handshake(status);
        *why = refused_tls ? kTlsRefusal : status.error_message();
        if (refused_tls || status.error_code() == grpc::StatusCode::UNAUTHENTICATED) {
            // A refused handshake is counted where gRPC logs it (peer/grpc_log.h).
            if (!refused_tls) failures_.count(FailureReason::Auth);
            spdlog::warn(
                "peer: seed {} refused this node: {}; until that is fixed this node trains alone",
                seed, *why);
        } else {
            spdlog::debug("peer: join through {} failed: {}", seed, *why);
        }
        return JoinResult::Unreachable;
    }
    merge_all(swim_, response.members(), config_.membership.max_members, seed.c_str(), true);
    spdlog::info("peer: joined through {}", seed);
    return JoinResult::Joined;
}

std::optional<Member> MembershipProtocol::ping(const std::string& address, uint64_t target_id) {
    return ping(address, target_id, config_.probe_timeout);
}

std::optional<Member> MembershipProtocol::ping(const std::string& address, uint64_t target_id,
                                               std::chrono::milliseconds timeout) {
    v1::PingResponse response;
    if (anchors_.holds(target_id)) {
        auto answer = anchors_.ping(target_id, timeout);
        if (!answer) return std::nullopt;
        response = std::move(*answer);
    } else {
        v1::PingRequest request;
        request.set_target_id(target_id);
        grpc::ClientContext context;
        set_deadline(context, timeout);
        auth_.attach(context, "Ping");
        count_sent(request);
        if (!v1::Peer::NewStub(channels_.get(address))->Ping(&context, request, &response).ok())
            return std::nullopt;
    }
    auto parsed = from_digest(response.self());
    auto* member = std::get_if<Member>(&parsed);
    if (!member || member->node_id != target_id) return std::nullopt;
    return *member;
}

std::optional<std::string> MembershipProtocol::duplicate_of(const Member& joiner) {
    const Member self = table().self();
    if (joiner.node_id == self.node_id && joiner.instance != self.instance) return self.address;
    const auto known = table().find(joiner.node_id);
    if (!known || known->instance == joiner.instance ||
        (known->state != MemberState::Alive && known->state != MemberState::Suspect))
        return std::nullopt;
    // The swarm knows another instance under this id: a duplicate only if that one still answers.
    const auto answer = ping(known->address, joiner.node_id);
    if (answer && answer->instance == known->instance) return known->address;
    return std::nullopt;
}

void MembershipProtocol::refresh(const std::vector<uint64_t>& node_ids) {
    std::vector<std::future<std::optional<Member>>> answers;
    for (const uint64_t id : node_ids)
        // A private member is reached only down its anchor stream, when this node holds it.
        if (const auto known = table().find(id); known && swim_.direct_probe(*known))
            answers.push_back(std::async(std::launch::async, [this, address = known->address, id] {
                return ping(address, id);
            }));
    for (auto& answer : answers)
        if (const auto member = answer.get()) {
            const auto now = SteadyClock::now();
            swim_.merge(*member, now);
            table().heard_from(member->node_id, now);
        }
}

std::optional<double> MembershipProtocol::round_trip_ms(uint64_t node_id) const {
    MutexLock lock(rtt_mutex_);
    const auto it = rtt_ms_.find(node_id);
    if (it == rtt_ms_.end()) return std::nullopt;
    return it->second;
}

bool MembershipProtocol::probe(const Member& target) {
    const auto timeout = swim_.probe_timeout_for(target.node_id, config_.probe_timeout);
    const auto sent = SteadyClock::now();
    // The direct ping stays open through the indirect probes (an ack any time in the protocol
    // period counts, as in SWIM): a member slower than its timeout still answers, and the round
    // trip its answer took raises its timeout for the next probe. Indirect probes start once the
    // timeout passes without an answer, or at once for a private member that this node does not
    // anchor: only its anchors can reach it.
    std::optional<std::future<std::optional<Member>>> direct;
    if (swim_.direct_probe(target))
        direct = std::async(std::launch::async,
                            [&] { return ping(target.address, target.node_id, timeout * 3); });
    const auto answered = [&](const Member& answer) {
        const auto now = SteadyClock::now();
        {
            MutexLock lock(rtt_mutex_);
            rtt_ms_[target.node_id] = std::chrono::duration<double, std::milli>(now - sent).count();
        }
        swim_.acked(target.node_id, now - sent);
        swim_.merge(answer, now);
        table().heard_from(answer.node_id, now);
        return true;
    };
    std::optional<std::optional<Member>> early;  // the direct answer, if in by the timeout
    if (direct && direct->wait_for(timeout) == std::future_status::ready) {
        early = direct->get();
        if (*early) return answered(**early);
    }
    // Indirect probes through up to k other members, at once, so a congested path between two
    // nodes alone does not make one suspect the other.
    std::vector<std::future<bool>> answers;
    for (const Member& helper : swim_.indirect_helpers(target.node_id)) {
        answers.push_back(std::async(std::launch::async, [&, helper] {
            v1::PingReqRequest request;
            request.set_target_id(target.node_id);
            request.set_target_address(target.address);
            v1::PingReqResponse response;
            grpc::ClientContext context;
            // The helper's own ping waits up to its timeout for the target: ours bounds it.
            set_deadline(context, timeout * 2);
            auth_.attach(context, "PingReq");
            count_sent(request);
            return v1::Peer::NewStub(channels_.get(helper.address))
                       ->PingReq(&context, request, &response)
                       .ok() &&
                   response.reached();
        }));
    }
    bool reached = false;
    for (auto& answer : answers) reached = answer.get() || reached;
    if (direct && !early)
        if (const auto late = direct->get()) reached = answered(*late);
    return reached;
}

void MembershipProtocol::gossip_with(const Member& target) {
    v1::GossipRequest request;
    fill_members(swim_.gossip_payload(), &request);
    v1::GossipResponse response;
    grpc::ClientContext context;
    set_deadline(context, config_.probe_timeout * 2);
    auth_.attach(context, "Gossip");
    count_sent(request);
    if (v1::Peer::NewStub(channels_.get(target.address))->Gossip(&context, request, &response).ok())
        merge_all(swim_, response.members(), config_.membership.max_members, target.address.c_str(),
                  true);
}

void MembershipProtocol::maintain_seeds(SteadyClock::time_point now) {
    std::optional<std::set<std::string>> member_addresses;  // taken once, and only if needed
    const auto is_member = [&](const std::string& seed) {
        if (!member_addresses) {
            member_addresses.emplace();
            for (const Member& m : table().reachable_others()) member_addresses->insert(m.address);
        }
        return seed == address_ || member_addresses->contains(seed);
    };
    for (const auto& seed : seeds_.due(now, is_member)) {
        std::string why;
        const auto result = try_join(seed, &why);
        if (result == JoinResult::Duplicate) spdlog::error("peer: {}", why);
        seeds_.tried(seed, result == JoinResult::Joined, SteadyClock::now());
    }
}

void MembershipProtocol::tick() {
    const auto now = SteadyClock::now();
    const SwimCore::Period period = swim_.tick(now);
    for (uint64_t id : period.declared_dead)
        spdlog::warn("peer: node {} declared dead", format_node_id(id));
    maintain_seeds(now);
    std::optional<Member> gossip = period.gossip;
    if (period.probe && !probe(*period.probe) &&
        swim_.probe_failed(period.probe->node_id, SteadyClock::now())) {
        spdlog::info("peer: node {} at {} does not answer; suspect",
                     format_node_id(period.probe->node_id), period.probe->address);
        if (callable(*period.probe)) gossip = period.probe;
    }
    if (gossip) gossip_with(*gossip);
    save_peer_cache();
    forget_departed();
}

void MembershipProtocol::forget_departed() {
    std::set<uint64_t> members;
    for (const Member& m : table().all()) members.insert(m.node_id);
    MutexLock lock(rtt_mutex_);
    std::erase_if(rtt_ms_, [&](const auto& entry) { return !members.contains(entry.first); });
}

std::set<std::string> MembershipProtocol::addresses_in_use() const {
    std::set<std::string> in_use;
    for (const Member& m : table().all()) in_use.insert(m.address);
    for (const auto& seed : seeds_.seeds()) in_use.insert(seed);
    return in_use;
}

void MembershipProtocol::save_peer_cache() {
    if (config_.data_dir.empty()) return;
    std::vector<std::string> addresses;
    for (const Member& m : table().reachable_others())
        if (table().compatible(m) && addresses.size() < 64) addresses.push_back(m.address);
    std::sort(addresses.begin(), addresses.end());
    // A change is written at most every kPeerCacheInterval: the cache is a hint for the next start,
    // and each write is an fsync on the protocol thread. Written on every change, 64 daemons under
    // suspicion storms kept the disk's journal busy and their probes late.
    if (addresses.empty() || addresses == cached_addresses_ || !peer_cache_writes_.due()) return;
    std::string text;
    for (const auto& a : addresses) text += a + "\n";
    try {
        write_file_atomic(config_.data_dir / "peers.txt", text);
        cached_addresses_ = std::move(addresses);
    } catch (const Error& e) {
        spdlog::warn("peer: cannot save the peer cache: {}", e.what());
    }
}

void MembershipProtocol::announce_leave() {
    table().leave();
    v1::LeaveRequest request;
    to_digest(table().self(), request.mutable_leaver());
    std::vector<std::future<void>> sent;
    for (const Member& m : table().reachable_others()) {
        sent.push_back(std::async(std::launch::async, [&, address = m.address] {
            v1::LeaveResponse response;
            grpc::ClientContext context;
            set_deadline(context, config_.probe_timeout);
            auth_.attach(context, "Leave");
            count_sent(request);
            v1::Peer::NewStub(channels_.get(address))->Leave(&context, request, &response);
        }));
    }
    for (auto& s : sent) s.get();
    spdlog::info("peer: node {} left the swarm", format_node_id(table().self().node_id));
}

void MembershipProtocol::count_sent(const google::protobuf::MessageLite& message) {
    sent_bytes_.fetch_add(message.ByteSizeLong(), std::memory_order_relaxed);
}

grpc::Status MembershipProtocol::answer_join(uint64_t caller, const v1::JoinRequest& request,
                                             v1::JoinResponse* response) {
    auto parsed = from_digest(request.joiner());
    if (auto* why = std::get_if<std::string>(&parsed))
        return {grpc::StatusCode::INVALID_ARGUMENT, "joiner digest: " + *why};
    const Member& joiner = std::get<Member>(parsed);
    if (joiner.node_id != caller)
        return {grpc::StatusCode::PERMISSION_DENIED, "a node can only join as itself"};
    // A seed name that covers every member leads a node to itself; it must try the others.
    if (const Member self = table().self();
        joiner.node_id == self.node_id && joiner.instance == self.instance)
        return {grpc::StatusCode::FAILED_PRECONDITION, "this is the joiner itself"};
    if (auto holder = duplicate_of(joiner))
        return {grpc::StatusCode::ALREADY_EXISTS,
                "node id " + format_node_id(joiner.node_id) + " is already live at " + *holder};
    merge_all(swim_, std::array{request.joiner()}, 1, "a joiner", true);
    fill_members(table().all(), response);
    count_sent(*response);
    return grpc::Status::OK;
}

grpc::Status MembershipProtocol::answer_gossip(const v1::GossipRequest& request,
                                               v1::GossipResponse* response) {
    merge_all(swim_, request.members(), config_.membership.max_members, "gossip", true);
    fill_members(swim_.gossip_payload(), response);
    count_sent(*response);
    return grpc::Status::OK;
}

grpc::Status MembershipProtocol::answer_ping(const v1::PingRequest& request,
                                             v1::PingResponse* response) {
    const uint64_t self = table().self().node_id;
    // Target 0 asks whoever answers (`starling check`); a probe names the node it expects.
    if (request.target_id() != 0 && request.target_id() != self)
        return {grpc::StatusCode::NOT_FOUND,
                "this address now belongs to node " + format_node_id(self)};
    to_digest(table().self(), response->mutable_self());
    count_sent(*response);
    return grpc::Status::OK;
}

grpc::Status MembershipProtocol::answer_ping_req(const v1::PingReqRequest& request,
                                                 v1::PingReqResponse* response) {
    if (request.target_address().size() > 262 || !parse_host_port(request.target_address()))
        return {grpc::StatusCode::INVALID_ARGUMENT, "target_address is not host:port"};
    const auto timeout = swim_.probe_timeout_for(request.target_id(), config_.probe_timeout);
    response->set_reached(ping(request.target_address(), request.target_id(), timeout).has_value());
    count_sent(*response);
    return grpc::Status::OK;
}

grpc::Status MembershipProtocol::answer_leave(uint64_t caller, const v1::LeaveRequest& request) {
    if (request.leaver().node_id() != caller)
        return {grpc::StatusCode::PERMISSION_DENIED, "a node can only announce its own leave"};
    if (request.leaver().state() != v1::MEMBER_STATE_LEFT)
        return {grpc::StatusCode::INVALID_ARGUMENT, "a leave must carry state LEFT"};
    merge_all(swim_, std::array{request.leaver()}, 1, "a leave", false);
    spdlog::info("peer: node {} left", format_node_id(caller));
    return grpc::Status::OK;
}

}  // namespace starling
