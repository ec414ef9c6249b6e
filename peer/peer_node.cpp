#include "peer/peer_node.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/method_handler.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <future>
#include <random>
#include <set>
#include <sstream>

#include "common/atomic_file.h"
#include "common/error.h"
#include "peer/address.h"
#include "peer/grpc_log.h"
#include "peer/identity.h"
#include "peer/wire.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {
namespace {

int64_t unix_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

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

// The server admits exchange frames, larger than any membership request may be.
grpc::Status within_cap(const google::protobuf::Message& request, size_t cap) {
    const size_t size = request.ByteSizeLong();
    if (size <= cap) return grpc::Status::OK;
    return {
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        "request of " + std::to_string(size) + " bytes, above the cap of " + std::to_string(cap)};
}

template <typename Response>
void fill_members(const MemberTable& table, Response* response) {
    for (const Member& m : table.all()) to_digest(m, response->add_members());
}

}  // namespace

class PeerNode::Service final : public v1::Peer::Service {
public:
    // Exchange streams carry wire frames (peer/exchange_frame.h), not protobuf messages.
    explicit Service(PeerNode& node) : node_(node) {
        MarkMethodStreamed(
            exchange_method_index(),
            new grpc::internal::BidiStreamingHandler<Service, ExchangeWireFrame, ExchangeWireFrame>(
                [](Service* service, grpc::ServerContext* context, ExchangeServerStream* stream) {
                    return service->exchange(context, stream);
                },
                this));
    }

    // Proof of membership, then the size cap of membership requests.
    grpc::Status admit(grpc::ServerContext* context, const char* method,
                       const google::protobuf::Message& request, uint64_t* caller) {
        if (auto status = node_.auth_.verify(*context, method, caller); !status.ok()) return status;
        return within_cap(request, node_.config_.max_message_bytes);
    }

    grpc::Status Join(grpc::ServerContext* context, const v1::JoinRequest* request,
                      v1::JoinResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "Join", *request, &caller); !status.ok()) return status;
        auto parsed = from_digest(request->joiner());
        if (auto* why = std::get_if<std::string>(&parsed))
            return {grpc::StatusCode::INVALID_ARGUMENT, "joiner digest: " + *why};
        const Member& joiner = std::get<Member>(parsed);
        if (joiner.node_id != caller)
            return {grpc::StatusCode::PERMISSION_DENIED, "a node can only join as itself"};
        // A seed name that covers every member leads a node to itself; it must try the others.
        if (const Member self = node_.table_->self();
            joiner.node_id == self.node_id && joiner.instance == self.instance)
            return {grpc::StatusCode::FAILED_PRECONDITION, "this is the joiner itself"};
        if (auto holder = node_.duplicate_of(joiner))
            return {grpc::StatusCode::ALREADY_EXISTS,
                    "node id " + format_node_id(joiner.node_id) + " is already live at " + *holder};
        merge_all(*node_.table_, std::array{request->joiner()}, 1, "a joiner");
        fill_members(*node_.table_, response);
        return grpc::Status::OK;
    }

    grpc::Status Gossip(grpc::ServerContext* context, const v1::GossipRequest* request,
                        v1::GossipResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "Gossip", *request, &caller); !status.ok()) return status;
        merge_all(*node_.table_, request->members(), node_.config_.membership.max_members,
                  "gossip");
        fill_members(*node_.table_, response);
        return grpc::Status::OK;
    }

    grpc::Status Ping(grpc::ServerContext* context, const v1::PingRequest* request,
                      v1::PingResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "Ping", *request, &caller); !status.ok()) return status;
        // Target 0 asks whoever answers (`starling check`); a probe names the node it expects.
        if (request->target_id() != 0 && request->target_id() != node_.node_id())
            return {grpc::StatusCode::NOT_FOUND,
                    "this address now belongs to node " + format_node_id(node_.node_id())};
        to_digest(node_.table_->self(), response->mutable_self());
        return grpc::Status::OK;
    }

    grpc::Status PingReq(grpc::ServerContext* context, const v1::PingReqRequest* request,
                         v1::PingReqResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "PingReq", *request, &caller); !status.ok()) return status;
        if (request->target_address().size() > 262 || !parse_host_port(request->target_address()))
            return {grpc::StatusCode::INVALID_ARGUMENT, "target_address is not host:port"};
        response->set_reached(
            node_.ping(request->target_address(), request->target_id()).has_value());
        return grpc::Status::OK;
    }

    grpc::Status Leave(grpc::ServerContext* context, const v1::LeaveRequest* request,
                       v1::LeaveResponse*) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "Leave", *request, &caller); !status.ok()) return status;
        if (request->leaver().node_id() != caller)
            return {grpc::StatusCode::PERMISSION_DENIED, "a node can only announce its own leave"};
        if (request->leaver().state() != v1::MEMBER_STATE_LEFT)
            return {grpc::StatusCode::INVALID_ARGUMENT, "a leave must carry state LEFT"};
        merge_all(*node_.table_, std::array{request->leaver()}, 1, "a leave");
        spdlog::info("peer: node {} left", format_node_id(caller));
        return grpc::Status::OK;
    }

    grpc::Status Pair(grpc::ServerContext* context, const v1::PairRequest* request,
                      v1::PairResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "Pair", *request, &caller); !status.ok()) return status;
        return node_.answer_pair(caller, *request, response);
    }

    grpc::Status FetchRoundMessage(grpc::ServerContext* context,
                                   const v1::FetchRoundMessageRequest* request,
                                   grpc::ServerWriter<v1::RoundMessageFrame>* writer) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "FetchRoundMessage", *request, &caller); !status.ok())
            return status;
        const auto member = node_.table_->find(caller);
        if (!member || !node_.table_->compatible(*member))
            return {grpc::StatusCode::PERMISSION_DENIED,
                    "node " + format_node_id(caller) + " is not a member of this model and swarm"};
        return serve_round_message(node_.round_messages_, request->round(),
                                   SteadyClock::now() + node_.config_.exchange_timeout, *writer);
    }

    grpc::Status exchange(grpc::ServerContext* context, ExchangeServerStream* stream) {
        uint64_t caller = 0;
        if (auto status = node_.auth_.verify(*context, "Exchange", &caller); !status.ok())
            return status;
        return node_.answer_exchange(*context, *stream, caller);
    }

private:
    PeerNode& node_;
};

PeerNode::PeerNode(const PeerConfig& config)
    : PeerNode(config, config.data_dir.empty() ? NodeIdentity::generate()
                                               : NodeIdentity::load_or_create(config.data_dir)) {}

namespace {

// Linking gRPC's reflection library registers its plugin for every server the process builds;
// the peer port must not describe every service and method to whoever connects, so this
// option takes the plugin out of the peer server's builder (the control server keeps it).
class WithoutReflection final : public grpc::ServerBuilderOption {
public:
    void UpdateArguments(grpc::ChannelArguments*) override {}
    void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
        std::erase_if(*plugins, [](const auto& plugin) {
            return plugin->name() == "proto_server_reflection";
        });
    }
};

// Nodes that trust one CA share its certificate, which then stands in for a swarm secret nobody
// set.
std::string swarm_key_material(const PeerConfig& config) {
    if (!config.swarm_secret.empty() || !config.tls.enabled()) return config.swarm_secret;
    return trust_anchor(config.tls);
}

}  // namespace

PeerNode::PeerNode(PeerConfig config, NodeIdentity identity)
    : config_(std::move(config)),
      identity_(identity),
      auth_(swarm_key_material(config_), identity_, config_.rate_limit),
      tls_(config_.tls.enabled()
               ? std::make_unique<TlsCertificates>(config_.tls, config_.data_dir.empty()
                                                                    ? std::filesystem::path()
                                                                    : config_.data_dir / "tls")
               : std::make_unique<TlsCertificates>(config_.swarm_secret)),
      channel_credentials_(tls_->channel_credentials()),
      // A joiner's next call (its first chunk after its manifests, the next chunk after one)
      // follows within a call timeout.
      snapshots_(config_.snapshots_kept, config_.state_sync_timeout),
      rng_(random_u64()) {}

PeerNode::~PeerNode() { stop(false); }

void PeerNode::start() {
    if (running_) throw Error("peer node already started");
    route_grpc_log();
    tls_failures_before_ = failed_tls_handshakes();
    service_ = std::make_unique<Service>(*this);
    grpc::ResourceQuota quota("starling-peer");
    quota.SetMaxThreads(config_.max_server_threads);
    grpc::ServerBuilder builder;
    state_sync_ = std::make_unique<StateSyncService>(snapshots_, auth_,
                                                     config_.max_concurrent_snapshot_chunks);
    gate_ = std::make_unique<ConnectionGate>(config_.listen, config_.connections);
    auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        tls_->server_credentials());
    auth_.on_proven([this](const grpc::ServerContextBase& call) { gate_->authenticated(call); });
    builder.RegisterService(service_.get());
    builder.RegisterService(state_sync_.get());
    // Exchange frames carry whole chunks; membership handlers check their own, smaller cap.
    const size_t max_frame = std::max(config_.max_message_bytes, kMaxExchangeFrameBytes);
    builder.SetMaxReceiveMessageSize(static_cast<int>(max_frame));
    builder.SetMaxSendMessageSize(static_cast<int>(max_frame));
    builder.SetResourceQuota(quota);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 64);
    builder.SetOption(std::make_unique<WithoutReflection>());
    // A connection that never finishes its handshake (a bare TCP connect, a TLS hello and
    // nothing more) holds a descriptor about as long as the gate gives it to authenticate, not
    // gRPC's default 120 s. The gate's cut comes first, so that its count and warning name each.
    constexpr int64_t kAfterTheGateMs = 5000;
    builder.AddChannelArgument(
        GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
        static_cast<int>(
            std::min<int64_t>(config_.connections.authenticate_within.count() + kAfterTheGateMs,
                              std::numeric_limits<int>::max())));
    // Connections from peers that died or went quiet are closed rather than kept for ever: a
    // keepalive ping finds the dead ones, the idle limit the ones nobody uses any more.
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 60000);
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 600000);
    // The table exists before the first call can arrive; the address is filled in once the
    // port is known.
    Member self;
    self.node_id = identity_.node_id();
    self.incarnation = static_cast<uint64_t>(unix_ms());
    self.fingerprint = config_.fingerprint;
    self.model = config_.model;
    self.method = config_.method;
    self.swarm_id = config_.swarm_id;
    self.public_key = identity_.public_key();
    self.instance = random_u64();
    table_ = std::make_unique<MemberTable>(self, config_.membership);
    pairing_ = std::make_unique<PairingBook>(self.node_id, config_.max_round_gap);
    exchanges_ = std::make_unique<ExchangeBoard>();
    server_ = builder.BuildAndStart();
    if (!server_) throw Error("cannot start the peer server on " + config_.listen);
    gate_->start(std::move(acceptor), [this](const std::string& address) {
        const std::vector<Member> members = table_->all();
        // Not this node's own host: a stranger there is no member.
        return std::any_of(members.begin() + 1, members.end(), [&](const Member& m) {
            const std::optional<HostPort> at = parse_host_port(m.address);
            return at && at->host == address;
        });
    });
    const uint16_t bound_port = gate_->port();
    std::vector<std::string> seeds = config_.seeds;
    try {
        address_ = choose_announce_address(config_.listen, config_.announce, bound_port, seeds);
    } catch (...) {
        server_->Shutdown();
        throw;
    }
    table_->set_address(address_);

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
        if (result == JoinResult::Duplicate) {
            server_->Shutdown();
            throw Error("cannot start: " + why +
                        "; two nodes share one key: give each node its own data directory");
        }
        if (result == JoinResult::Joined) break;
    }
    if (!first_tries.empty() && table_->reachable_others().empty())
        spdlog::warn("peer: no seed answered; running alone and retrying with backoff");
    spdlog::info("peer: node {} at {} in swarm '{}', {} member(s) known", format_node_id(node_id()),
                 address_, config_.swarm_id, table_->all().size());
    running_ = true;
    {
        // The protocol thread is not running yet: locked for the analysis, never waited for.
        MutexLock lock(run_mutex_);
        stopping_ = false;
    }
    thread_ = std::thread([this] { run(); });
}

void PeerNode::reload_tls(const TlsConfig& tls) {
    if (tls_->from_secret() && !tls.enabled()) return;
    if (tls_->from_secret() || !tls.enabled())
        throw Error(std::string("TLS files cannot be turned ") + (tls.enabled() ? "on" : "off") +
                    " while the node runs: restart it");
    tls_->reload(tls);
    spdlog::info("peer: TLS certificate {} in use for new connections", tls.cert.string());
}

void PeerNode::add_seeds(const std::vector<std::string>& seeds) {
    MutexLock lock(seeds_mutex_);
    for (const auto& seed : seeds) {
        if (!parse_host_port(seed)) throw Error("'" + seed + "' is not host:port");
        seeds_[seed] = SeedState{};
    }
}

grpc::ChannelArguments PeerNode::channel_arguments(ChannelUse use) const {
    grpc::ChannelArguments args;
    const size_t cap =
        use == ChannelUse::Exchange ? kMaxExchangeFrameBytes : config_.max_message_bytes;
    args.SetMaxReceiveMessageSize(static_cast<int>(cap));
    args.SetMaxSendMessageSize(static_cast<int>(cap));
    // A channel of its own subchannels opens its own connection.
    if (use == ChannelUse::Exchange) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    // Probes must see a dead peer at once, not after a reconnect backoff of many seconds.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    return args;
}

std::shared_ptr<grpc::Channel> PeerNode::channel(const std::string& address, ChannelUse use) {
    MutexLock lock(channels_mutex_);
    auto& channel = channels_[{address, use}];
    if (!channel)
        channel = grpc::CreateCustomChannel(address, channel_credentials_, channel_arguments(use));
    return channel;
}

std::shared_ptr<grpc::Channel> PeerNode::seed_address_channel(const std::string& target,
                                                              const std::string& seed) {
    grpc::ChannelArguments args = channel_arguments(ChannelUse::Membership);
    if (config_.tls.enabled()) args.SetSslTargetNameOverride(parse_host_port(seed)->host);
    return grpc::CreateCustomChannel(target, channel_credentials_, args);
}

SeedAnswer ask_seed(const PeerConfig& config, const std::string& seed,
                    std::chrono::milliseconds timeout) {
    const NodeIdentity stranger = NodeIdentity::generate();
    const SwarmAuth auth(swarm_key_material(config), stranger);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout);
    auth.attach(context, "Ping");
    v1::PingRequest request;
    request.set_target_id(0);  // whoever answers
    v1::PingResponse response;
    const auto status =
        v1::Peer::NewStub(
            grpc::CreateChannel(seed, channel_credentials(config.tls, config.swarm_secret)))
            ->Ping(&context, request, &response);
    if (refused_in_tls_handshake(status)) return {std::nullopt, kTlsRefusal};
    if (!status.ok())
        return {std::nullopt, status.error_message().empty()
                                  ? "gRPC status " + std::to_string(status.error_code())
                                  : status.error_message()};
    auto parsed = from_digest(response.self());
    if (auto* why = std::get_if<std::string>(&parsed))
        return {std::nullopt, "its answer is unusable: " + *why};
    return {std::get<Member>(std::move(parsed)), ""};
}

std::vector<std::string> PeerNode::join_seeds(const std::vector<std::string>& seeds,
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

PeerNode::JoinResult PeerNode::try_join(const std::string& seed, std::string* why,
                                        SteadyClock::time_point by) {
    const std::vector<std::string> targets = config_.resolve_seed(seed);
    if (targets.size() <= 1) return join_through(seed, channel(seed), why, by);
    // A name for several members (a headless service): any of them will do, but one may be this
    // node.
    size_t self = 0;
    for (const std::string& target : targets) {
        const JoinResult result =
            join_through(seed + " at " + target, seed_address_channel(target, seed), why, by);
        if (result == JoinResult::Joined || result == JoinResult::Duplicate) return result;
        if (result == JoinResult::Self) ++self;
    }
    return self == targets.size() ? JoinResult::Self : JoinResult::Unreachable;
}

PeerNode::JoinResult PeerNode::join_through(const std::string& seed,
                                            const std::shared_ptr<grpc::Channel>& channel,
                                            std::string* why, SteadyClock::time_point by) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(by - SteadyClock::now());
    if (left <= std::chrono::milliseconds(0)) {
        *why = "no time was left to dial it";
        return JoinResult::Unreachable;
    }
    v1::JoinRequest request;
    to_digest(table_->self(), request.mutable_joiner());
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
    merge_all(*table_, response.members(), config_.membership.max_members, seed.c_str());
    spdlog::info("peer: joined through {}", seed);
    return JoinResult::Joined;
}

std::optional<Member> PeerNode::ping(const std::string& address, uint64_t target_id) {
    v1::PingRequest request;
    request.set_target_id(target_id);
    v1::PingResponse response;
    grpc::ClientContext context;
    set_deadline(context, config_.probe_timeout);
    auth_.attach(context, "Ping");
    if (!v1::Peer::NewStub(channel(address))->Ping(&context, request, &response).ok())
        return std::nullopt;
    auto parsed = from_digest(response.self());
    auto* member = std::get_if<Member>(&parsed);
    if (!member || member->node_id != target_id) return std::nullopt;
    return *member;
}

std::optional<std::string> PeerNode::duplicate_of(const Member& joiner) {
    const Member self = table_->self();
    if (joiner.node_id == self.node_id && joiner.instance != self.instance) return self.address;
    const auto known = table_->find(joiner.node_id);
    if (!known || known->instance == joiner.instance ||
        (known->state != MemberState::Alive && known->state != MemberState::Suspect))
        return std::nullopt;
    // The swarm knows another instance under this id: a duplicate only if that one still answers.
    const auto answer = ping(known->address, joiner.node_id);
    if (answer && answer->instance == known->instance) return known->address;
    return std::nullopt;
}

void PeerNode::refresh(const std::vector<uint64_t>& node_ids) {
    std::vector<std::future<std::optional<Member>>> answers;
    for (const uint64_t id : node_ids)
        if (const auto known = table_->find(id))
            answers.push_back(std::async(std::launch::async, [this, address = known->address, id] {
                return ping(address, id);
            }));
    for (auto& answer : answers)
        if (const auto member = answer.get()) table_->merge(*member, SteadyClock::now());
}

std::optional<double> PeerNode::round_trip_ms(uint64_t node_id) const {
    MutexLock lock(rtt_mutex_);
    const auto it = rtt_ms_.find(node_id);
    if (it == rtt_ms_.end()) return std::nullopt;
    return it->second;
}

bool PeerNode::probe(const Member& target) {
    const auto sent = SteadyClock::now();
    if (auto answer = ping(target.address, target.node_id)) {
        const auto now = SteadyClock::now();
        {
            MutexLock lock(rtt_mutex_);
            rtt_ms_[target.node_id] = std::chrono::duration<double, std::milli>(now - sent).count();
        }
        table_->merge(*answer, now);
        return true;
    }
    // Indirect probes through up to k other members, at once, so a congested path between two
    // nodes alone does not make one suspect the other.
    auto helpers = table_->reachable_others();
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
            return v1::Peer::NewStub(channel(helper.address))
                       ->PingReq(&context, request, &response)
                       .ok() &&
                   response.reached();
        }));
    }
    bool reached = false;
    for (auto& answer : answers) reached = answer.get() || reached;
    return reached;
}

void PeerNode::gossip_with(const Member& target) {
    v1::GossipRequest request;
    for (const Member& m : table_->all()) to_digest(m, request.add_members());
    v1::GossipResponse response;
    grpc::ClientContext context;
    set_deadline(context, config_.probe_timeout * 2);
    auth_.attach(context, "Gossip");
    if (v1::Peer::NewStub(channel(target.address))->Gossip(&context, request, &response).ok())
        merge_all(*table_, response.members(), config_.membership.max_members,
                  target.address.c_str());
}

void PeerNode::maintain_seeds(SteadyClock::time_point now) {
    std::vector<std::string> due;
    {
        MutexLock lock(seeds_mutex_);
        const auto known = table_->reachable_others();
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

void PeerNode::tick() {
    const auto now = SteadyClock::now();
    for (uint64_t id : table_->expire(now))
        spdlog::warn("peer: node {} declared dead", format_node_id(id));
    maintain_seeds(now);

    const auto others = table_->reachable_others();
    if (others.empty()) return;
    // Round-robin over a shuffled order (SWIM's bound on the time to first probe of a failure).
    if (probe_next_ >= probe_order_.size()) {
        probe_order_.clear();
        for (const Member& m : others) probe_order_.push_back(m.node_id);
        std::shuffle(probe_order_.begin(), probe_order_.end(), rng_);
        probe_next_ = 0;
    }
    if (const auto target = table_->find(probe_order_[probe_next_++]);
        target && (target->state == MemberState::Alive || target->state == MemberState::Suspect)) {
        if (!probe(*target)) {
            if (target->state == MemberState::Alive)
                spdlog::info("peer: node {} at {} does not answer; suspect",
                             format_node_id(target->node_id), target->address);
            table_->suspect(target->node_id, SteadyClock::now());
        }
    }
    gossip_with(others[std::uniform_int_distribution<size_t>(0, others.size() - 1)(rng_)]);
    save_peer_cache();
    close_unused_channels();
}

void PeerNode::close_unused_channels() {
    std::set<std::string> wanted;
    std::set<uint64_t> members;
    for (const Member& m : table_->all()) {
        wanted.insert(m.address);
        members.insert(m.node_id);
    }
    {
        MutexLock lock(rtt_mutex_);
        std::erase_if(rtt_ms_, [&](const auto& entry) { return !members.contains(entry.first); });
        std::erase_if(exchange_bytes_per_s_,
                      [&](const auto& entry) { return !members.contains(entry.first); });
    }
    {
        MutexLock lock(seeds_mutex_);
        for (const auto& [seed, state] : seeds_) wanted.insert(seed);
    }
    // Calls in flight hold their own reference; the connection closes when the last one ends.
    MutexLock lock(channels_mutex_);
    std::erase_if(channels_,
                  [&](const auto& entry) { return !wanted.contains(entry.first.first); });
}

size_t PeerNode::open_channels() const {
    MutexLock lock(channels_mutex_);
    return channels_.size();
}

void PeerNode::save_peer_cache() {
    if (config_.data_dir.empty()) return;
    std::vector<std::string> addresses;
    for (const Member& m : table_->reachable_others())
        if (table_->compatible(m) && addresses.size() < 64) addresses.push_back(m.address);
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

void PeerNode::run() {
    auto next = SteadyClock::now();
    MutexLock lock(run_mutex_);
    while (!stopping_) {
        if (lock.wait_until(wake_, next,
                            [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mutex_) { return stopping_; }))
            break;
        lock.unlock();
        tick();
        lock.lock();
        next = std::max(next + config_.gossip_interval, SteadyClock::now());
    }
}

void PeerNode::leave() { stop(true); }

void PeerNode::kill() { stop(false); }

void PeerNode::set_serving(bool serving) {
    if (server_ && server_->GetHealthCheckService())
        server_->GetHealthCheckService()->SetServingStatus(serving);
}

void PeerNode::stop(bool announce) {
    if (!running_.exchange(false)) return;
    // Pairing waits and exchanges end first: nobody should wait on a node that is going.
    pairing_->stop();
    exchanges_->stop();
    round_messages_.stop();
    {
        MutexLock lock(run_mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
    if (announce) {
        table_->leave();
        v1::LeaveRequest request;
        to_digest(table_->self(), request.mutable_leaver());
        std::vector<std::future<void>> sent;
        for (const Member& m : table_->reachable_others()) {
            sent.push_back(std::async(std::launch::async, [&, address = m.address] {
                v1::LeaveResponse response;
                grpc::ClientContext context;
                set_deadline(context, config_.probe_timeout);
                auth_.attach(context, "Leave");
                v1::Peer::NewStub(channel(address))->Leave(&context, request, &response);
            }));
        }
        for (auto& s : sent) s.get();
        spdlog::info("peer: node {} left the swarm", format_node_id(node_id()));
    }
    gate_->stop();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
}

}  // namespace starling
