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

// Merges every usable digest; an unusable one is logged with its reason and skipped.
template <typename Digests>
void merge_all(MemberTable& table, const Digests& digests, size_t limit, const char* source) {
    const auto now = SteadyClock::now();
    size_t taken = 0;
    for (const auto& digest : digests) {
        if (taken++ == limit) break;
        auto parsed = from_digest(digest);
        if (auto* why = std::get_if<std::string>(&parsed)) {
            spdlog::debug("peer: dropped a member digest from {}: {}", source, *why);
            continue;
        }
        const Member& member = std::get<Member>(parsed);
        const auto result = table.merge(member, now);
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

template <typename Response>
void fill_members(const MemberTable& table, Response* response) {
    for (const Member& m : table.all()) to_digest(m, response->add_members());
}

}  // namespace

MembershipProtocol::MembershipProtocol(const PeerConfig& config, Member self, SwarmAuth& auth,
                                       PeerChannels& channels, FailureTally& failures)
    : config_(config),
      auth_(auth),
      channels_(channels),
      failures_(failures),
      table_(std::move(self), config.membership),
      rng_(random_u64()) {}

void MembershipProtocol::set_address(const std::string& address) {
    address_ = address;
    table_.set_address(address);
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
    // Nothing else touches seeds_ before the protocol thread starts; the joins run without its
    // lock all the same, as in maintain_seeds, so they go through a copy of its addresses.
    std::vector<std::string> first_tries;
    {
        MutexLock lock(seeds_mutex_);
        for (const auto& seed : seeds)
            if (seed != address_) seeds_.emplace(seed, SeedState{});
        for (const auto& [seed, state] : seeds_) first_tries.push_back(seed);
    }
    for (const auto& seed : first_tries) {
        std::string why;
        const auto result = try_join(seed, &why);
        if (result == JoinResult::Duplicate)
            throw Error("cannot start: " + why +
                        "; two nodes share one key: give each node its own data directory");
        if (result == JoinResult::Joined) break;
    }
    if (!first_tries.empty() && table_.reachable_others().empty())
        spdlog::warn("peer: no seed answered; running alone and retrying with backoff");
}

void MembershipProtocol::add_seeds(const std::vector<std::string>& seeds) {
    MutexLock lock(seeds_mutex_);
    for (const auto& seed : seeds) {
        if (!parse_host_port(seed)) throw Error("'" + seed + "' is not host:port");
        seeds_[seed] = SeedState{};
    }
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
    to_digest(table_.self(), request.mutable_joiner());
    v1::JoinResponse response;
    grpc::ClientContext context;
    set_deadline(context, std::min(config_.probe_timeout * 4, left));
    auth_.attach(context, "Join");
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
    merge_all(table_, response.members(), config_.membership.max_members, seed.c_str());
    spdlog::info("peer: joined through {}", seed);
    return JoinResult::Joined;
}

std::optional<Member> MembershipProtocol::ping(const std::string& address, uint64_t target_id) {
    v1::PingRequest request;
    request.set_target_id(target_id);
    v1::PingResponse response;
    grpc::ClientContext context;
    set_deadline(context, config_.probe_timeout);
    auth_.attach(context, "Ping");
    if (!v1::Peer::NewStub(channels_.get(address))->Ping(&context, request, &response).ok())
        return std::nullopt;
    auto parsed = from_digest(response.self());
    auto* member = std::get_if<Member>(&parsed);
    if (!member || member->node_id != target_id) return std::nullopt;
    return *member;
}

std::optional<std::string> MembershipProtocol::duplicate_of(const Member& joiner) {
    const Member self = table_.self();
    if (joiner.node_id == self.node_id && joiner.instance != self.instance) return self.address;
    const auto known = table_.find(joiner.node_id);
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
        if (const auto known = table_.find(id))
            answers.push_back(std::async(std::launch::async, [this, address = known->address, id] {
                return ping(address, id);
            }));
    for (auto& answer : answers)
        if (const auto member = answer.get()) table_.merge(*member, SteadyClock::now());
}

std::optional<double> MembershipProtocol::round_trip_ms(uint64_t node_id) const {
    MutexLock lock(rtt_mutex_);
    const auto it = rtt_ms_.find(node_id);
    if (it == rtt_ms_.end()) return std::nullopt;
    return it->second;
}

bool MembershipProtocol::probe(const Member& target) {
    const auto sent = SteadyClock::now();
    if (auto answer = ping(target.address, target.node_id)) {
        const auto now = SteadyClock::now();
        {
            MutexLock lock(rtt_mutex_);
            rtt_ms_[target.node_id] = std::chrono::duration<double, std::milli>(now - sent).count();
        }
        table_.merge(*answer, now);
        return true;
    }
    // Indirect probes through up to k other members, at once, so a congested path between two
    // nodes alone does not make one suspect the other.
    auto helpers = table_.reachable_others();
    std::erase_if(helpers, [&](const Member& m) { return m.node_id == target.node_id; });
    std::shuffle(helpers.begin(), helpers.end(), rng_);
    if (helpers.size() > static_cast<size_t>(config_.indirect_probes))
        helpers.resize(config_.indirect_probes);
    std::vector<std::future<bool>> answers;
    for (const Member& helper : helpers) {
        answers.push_back(std::async(std::launch::async, [&, helper] {
            v1::PingReqRequest request;
            request.set_target_id(target.node_id);
            request.set_target_address(target.address);
            v1::PingReqResponse response;
            grpc::ClientContext context;
            set_deadline(context, config_.probe_timeout * 2);
            auth_.attach(context, "PingReq");
            return v1::Peer::NewStub(channels_.get(helper.address))
                       ->PingReq(&context, request, &response)
                       .ok() &&
                   response.reached();
        }));
    }
    bool reached = false;
    for (auto& answer : answers) reached = answer.get() || reached;
    return reached;
}

void MembershipProtocol::gossip_with(const Member& target) {
    v1::GossipRequest request;
    for (const Member& m : table_.all()) to_digest(m, request.add_members());
    v1::GossipResponse response;
    grpc::ClientContext context;
    set_deadline(context, config_.probe_timeout * 2);
    auth_.attach(context, "Gossip");
    if (v1::Peer::NewStub(channels_.get(target.address))->Gossip(&context, request, &response).ok())
        merge_all(table_, response.members(), config_.membership.max_members,
                  target.address.c_str());
}

void MembershipProtocol::maintain_seeds(SteadyClock::time_point now) {
    std::vector<std::string> due;
    {
        MutexLock lock(seeds_mutex_);
        const auto known = table_.reachable_others();
        for (auto& [address, state] : seeds_) {
            // A named reference, not the binding: clang 14 cannot capture structured bindings.
            const std::string& seed = address;
            const bool member = std::any_of(known.begin(), known.end(),
                                            [&](const Member& m) { return m.address == seed; });
            if (member || seed == address_) {
                state = SeedState{};
            } else if (now >= state.next_try) {
                due.push_back(seed);
            }
        }
    }
    for (const auto& seed : due) {
        std::string why;
        const auto result = try_join(seed, &why);
        if (result == JoinResult::Duplicate) spdlog::error("peer: {}", why);
        MutexLock lock(seeds_mutex_);
        auto& state = seeds_[seed];
        // After a join the seed is normally a member, which resets its state above; one under
        // another name than its members announce (a service's) is tried again only now and then.
        state.backoff = result == JoinResult::Joined
                            ? config_.join_backoff_max
                            : std::min(config_.join_backoff_max,
                                       std::max(config_.gossip_interval, state.backoff * 2));
        state.next_try = SteadyClock::now() + state.backoff;
    }
}

void MembershipProtocol::tick() {
    const auto now = SteadyClock::now();
    for (uint64_t id : table_.expire(now))
        spdlog::warn("peer: node {} declared dead", format_node_id(id));
    maintain_seeds(now);

    const auto others = table_.reachable_others();
    if (others.empty()) return;
    // Round-robin over a shuffled order (SWIM's bound on the time to first probe of a failure).
    if (probe_next_ >= probe_order_.size()) {
        probe_order_.clear();
        for (const Member& m : others) probe_order_.push_back(m.node_id);
        std::shuffle(probe_order_.begin(), probe_order_.end(), rng_);
        probe_next_ = 0;
    }
    if (const auto target = table_.find(probe_order_[probe_next_++]);
        target && (target->state == MemberState::Alive || target->state == MemberState::Suspect)) {
        if (!probe(*target)) {
            if (target->state == MemberState::Alive)
                spdlog::info("peer: node {} at {} does not answer; suspect",
                             format_node_id(target->node_id), target->address);
            table_.suspect(target->node_id, SteadyClock::now());
        }
    }
    gossip_with(others[std::uniform_int_distribution<size_t>(0, others.size() - 1)(rng_)]);
    save_peer_cache();
    forget_departed();
}

void MembershipProtocol::forget_departed() {
    std::set<uint64_t> members;
    for (const Member& m : table_.all()) members.insert(m.node_id);
    MutexLock lock(rtt_mutex_);
    std::erase_if(rtt_ms_, [&](const auto& entry) { return !members.contains(entry.first); });
}

std::set<std::string> MembershipProtocol::addresses_in_use() const {
    std::set<std::string> in_use;
    for (const Member& m : table_.all()) in_use.insert(m.address);
    MutexLock lock(seeds_mutex_);
    for (const auto& [seed, state] : seeds_) in_use.insert(seed);
    return in_use;
}

void MembershipProtocol::save_peer_cache() {
    if (config_.data_dir.empty()) return;
    std::vector<std::string> addresses;
    for (const Member& m : table_.reachable_others())
        if (table_.compatible(m) && addresses.size() < 64) addresses.push_back(m.address);
    std::sort(addresses.begin(), addresses.end());
    if (addresses.empty() || addresses == cached_addresses_) return;
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
    table_.leave();
    v1::LeaveRequest request;
    to_digest(table_.self(), request.mutable_leaver());
    std::vector<std::future<void>> sent;
    for (const Member& m : table_.reachable_others()) {
        sent.push_back(std::async(std::launch::async, [&, address = m.address] {
            v1::LeaveResponse response;
            grpc::ClientContext context;
            set_deadline(context, config_.probe_timeout);
            auth_.attach(context, "Leave");
            v1::Peer::NewStub(channels_.get(address))->Leave(&context, request, &response);
        }));
    }
    for (auto& s : sent) s.get();
    spdlog::info("peer: node {} left the swarm", format_node_id(table_.self().node_id));
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
    if (const Member self = table_.self();
        joiner.node_id == self.node_id && joiner.instance == self.instance)
        return {grpc::StatusCode::FAILED_PRECONDITION, "this is the joiner itself"};
    if (auto holder = duplicate_of(joiner))
        return {grpc::StatusCode::ALREADY_EXISTS,
                "node id " + format_node_id(joiner.node_id) + " is already live at " + *holder};
    merge_all(table_, std::array{request.joiner()}, 1, "a joiner");
    fill_members(table_, response);
    return grpc::Status::OK;
}

grpc::Status MembershipProtocol::answer_gossip(const v1::GossipRequest& request,
                                               v1::GossipResponse* response) {
    merge_all(table_, request.members(), config_.membership.max_members, "gossip");
    fill_members(table_, response);
    return grpc::Status::OK;
}

grpc::Status MembershipProtocol::answer_ping(const v1::PingRequest& request,
                                             v1::PingResponse* response) {
    const uint64_t self = table_.self().node_id;
    // Target 0 asks whoever answers (`starling check`); a probe names the node it expects.
    if (request.target_id() != 0 && request.target_id() != self)
        return {grpc::StatusCode::NOT_FOUND,
                "this address now belongs to node " + format_node_id(self)};
    to_digest(table_.self(), response->mutable_self());
    return grpc::Status::OK;
}

grpc::Status MembershipProtocol::answer_ping_req(const v1::PingReqRequest& request,
                                                 v1::PingReqResponse* response) {
    if (request.target_address().size() > 262 || !parse_host_port(request.target_address()))
        return {grpc::StatusCode::INVALID_ARGUMENT, "target_address is not host:port"};
    response->set_reached(ping(request.target_address(), request.target_id()).has_value());
    return grpc::Status::OK;
}

grpc::Status MembershipProtocol::answer_leave(uint64_t caller, const v1::LeaveRequest& request) {
    if (request.leaver().node_id() != caller)
        return {grpc::StatusCode::PERMISSION_DENIED, "a node can only announce its own leave"};
    if (request.leaver().state() != v1::MEMBER_STATE_LEFT)
        return {grpc::StatusCode::INVALID_ARGUMENT, "a leave must carry state LEFT"};
    merge_all(table_, std::array{request.leaver()}, 1, "a leave");
    spdlog::info("peer: node {} left", format_node_id(caller));
    return grpc::Status::OK;
}

}  // namespace starling
