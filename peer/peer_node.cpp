#include "peer/peer_node.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/impl/server_builder_plugin.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/method_handler.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <set>

#include "common/error.h"
#include "peer/address.h"
#include "peer/grpc_log.h"
#include "peer/wire.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {
namespace {

int64_t unix_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// The server admits exchange frames, larger than any membership request may be.
grpc::Status within_cap(const google::protobuf::Message& request, size_t cap) {
    const size_t size = request.ByteSizeLong();
    if (size <= cap) return grpc::Status::OK;
    return {
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        "request of " + std::to_string(size) + " bytes, above the cap of " + std::to_string(cap)};
}

}  // namespace

class PeerNode::Service final : public v1::Peer::Service {
public:
    explicit Service(PeerNode& node) : node_(node) {
        serve_frames(ExchangeMethod::Exchange, &Service::exchange);
        serve_frames(ExchangeMethod::RelayExchange, &Service::relay_exchange);
    }

    // Exchange streams carry wire frames (peer/exchange_frame.h), not protobuf messages.
    void serve_frames(ExchangeMethod method,
                      grpc::Status (Service::*handler)(grpc::ServerContext*,
                                                       ExchangeServerStream*)) {
        MarkMethodStreamed(
            exchange_method_index(method),
            new grpc::internal::BidiStreamingHandler<Service, ExchangeWireFrame, ExchangeWireFrame>(
                [handler](Service* service, grpc::ServerContext* context,
                          ExchangeServerStream* stream) {
                    return (service->*handler)(context, stream);
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
        return node_.membership_->answer_join(caller, *request, response);
    }

    grpc::Status Gossip(grpc::ServerContext* context, const v1::GossipRequest* request,
                        v1::GossipResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "Gossip", *request, &caller); !status.ok()) return status;
        return node_.membership_->answer_gossip(*request, response);
    }

    grpc::Status Ping(grpc::ServerContext* context, const v1::PingRequest* request,
                      v1::PingResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "Ping", *request, &caller); !status.ok()) return status;
        return node_.membership_->answer_ping(*request, response);
    }

    grpc::Status PingReq(grpc::ServerContext* context, const v1::PingReqRequest* request,
                         v1::PingReqResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "PingReq", *request, &caller); !status.ok()) return status;
        return node_.membership_->answer_ping_req(*request, response);
    }

    grpc::Status Leave(grpc::ServerContext* context, const v1::LeaveRequest* request,
                       v1::LeaveResponse*) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "Leave", *request, &caller); !status.ok()) return status;
        return node_.membership_->answer_leave(caller, *request);
    }

    grpc::Status DialBack(grpc::ServerContext* context, const v1::DialBackRequest* request,
                          v1::DialBackResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "DialBack", *request, &caller); !status.ok())
            return status;
        return node_.reachability_->answer_dial_back(caller, context->peer(), *request, response);
    }

    grpc::Status Pair(grpc::ServerContext* context, const v1::PairRequest* request,
                      v1::PairResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "Pair", *request, &caller); !status.ok()) return status;
        return node_.rounds_->answer_pair(caller, *request, response);
    }

    grpc::Status RelayPair(grpc::ServerContext* context, const v1::RelayPairRequest* request,
                           v1::PairResponse* response) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "RelayPair", *request, &caller); !status.ok())
            return status;
        // A proposal that names this node as its exchange's relay is refused here when this node
        // relays none, so that the proposer tries the member's next anchor.
        if (request->pair().relay() == node_.node_id() && node_.config_.relay_bytes_per_s <= 0)
            return {grpc::StatusCode::RESOURCE_EXHAUSTED,
                    "this node relays no exchange ([peer].relay_mbit is 0)"};
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            context->deadline() - std::chrono::system_clock::now());
        auto answer = node_.anchor_hub_.pair(request->target_id(), caller, request->pair(),
                                             std::min(left, node_.config_.pair_timeout));
        if (!answer) {
            if (!node_.anchor_hub_.holds(request->target_id()))
                return {grpc::StatusCode::NOT_FOUND, "this node holds no stream of node " +
                                                         format_node_id(request->target_id())};
            return {grpc::StatusCode::DEADLINE_EXCEEDED,
                    "node " + format_node_id(request->target_id()) + " did not answer in time"};
        }
        *response = std::move(*answer);
        return grpc::Status::OK;
    }

    grpc::Status FetchRoundMessage(grpc::ServerContext* context,
                                   const v1::FetchRoundMessageRequest* request,
                                   grpc::ServerWriter<v1::RoundMessageFrame>* writer) override {
        uint64_t caller = 0;
        if (auto status = admit(context, "FetchRoundMessage", *request, &caller); !status.ok())
            return status;
        return node_.rounds_->answer_round_message(caller, *request, *writer);
    }

    grpc::Status DepositRoundMessage(grpc::ServerContext* context,
                                     grpc::ServerReader<v1::DepositRoundMessageFrame>* reader,
                                     v1::DepositRoundMessageResponse*) override {
        uint64_t caller = 0;
        if (auto status = node_.auth_.verify(*context, "DepositRoundMessage", &caller);
            !status.ok())
            return status;
        return node_.rounds_->answer_deposit(caller, *reader);
    }

    grpc::Status Anchor(grpc::ServerContext* context, AnchorServerStream* stream) override {
        uint64_t caller = 0;
        if (auto status = node_.auth_.verify(*context, "Anchor", &caller); !status.ok())
            return status;
        return node_.anchor_hub_.serve(caller, *context, *stream);
    }

    grpc::Status exchange(grpc::ServerContext* context, ExchangeServerStream* stream) {
        uint64_t caller = 0;
        if (auto status = node_.auth_.verify(*context, "Exchange", &caller); !status.ok())
            return status;
        return node_.rounds_->answer_exchange(*context, *stream, caller);
    }

    grpc::Status relay_exchange(grpc::ServerContext* context, ExchangeServerStream* stream) {
        uint64_t caller = 0;
        if (auto status = node_.auth_.verify(*context, "RelayExchange", &caller); !status.ok())
            return status;
        return node_.rounds_->answer_relay_exchange(*context, *stream, caller);
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

}  // namespace

PeerNode::PeerNode(PeerConfig config, NodeIdentity identity)
    : config_(std::move(config)),
      identity_(identity),
      auth_(swarm_key_material(config_), identity_, config_.rate_limit),
      channels_(config_.tls, config_.swarm_secret, config_.data_dir, config_.max_message_bytes),
      // A joiner's next call (its first chunk after its manifests, the next chunk after one)
      // follows within a call timeout.
      state_sync_(auth_, config_.snapshots_kept, config_.state_sync_timeout,
                  config_.max_concurrent_snapshot_chunks) {}

PeerNode::~PeerNode() { stop(false); }

void PeerNode::start() {
    if (running_) throw Error("peer node already started");
    route_grpc_log();
    tls_failures_before_ = failed_tls_handshakes();
    service_ = std::make_unique<Service>(*this);
    grpc::ResourceQuota quota("starling-peer");
    quota.SetMaxThreads(config_.max_server_threads);
    grpc::ServerBuilder builder;
    gate_ = std::make_unique<ConnectionGate>(config_.listen, config_.connections);
    auto acceptor = builder.experimental().AddExternalConnectionAcceptor(
        grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
        channels_.server_credentials());
    auth_.on_proven([this](const grpc::ServerContextBase& call) { gate_->authenticated(call); });
    builder.RegisterService(service_.get());
    builder.RegisterService(&state_sync_.service());
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
    membership_ = std::make_unique<MembershipProtocol>(config_, self, auth_, channels_, failures_,
                                                       anchor_hub_);
    rounds_ = std::make_unique<RoundPeers>(config_, identity_, membership_->table(), auth_,
                                           channels_, failures_, anchor_hub_,
                                           [this](UniqueFd fd) { gate_->adopt(std::move(fd)); });
    reachability_ = std::make_unique<ReachabilityWatch>(membership_->table(), channels_, auth_);
    anchor_links_ = std::make_unique<AnchorLinks>(
        membership_->table(), channels_, auth_,
        [this](uint64_t id) { return membership_->round_trip_ms(id); },
        [this](const v1::PingRequest& request, v1::PingResponse* response) {
            membership_->answer_ping(request, response);
        },
        [this](uint64_t proposer, const v1::PairRequest& request, v1::PairResponse* response) {
            // A refusal is an answer too: its reason, not accepted.
            if (const auto status = rounds_->answer_pair(proposer, request, response); !status.ok())
                response->set_reason(status.error_message());
        });
    server_ = builder.BuildAndStart();
    if (!server_) throw Error("cannot start the peer server on " + config_.listen);
    gate_->start(
        std::move(acceptor),
        [this](const std::string& address) {
            const std::vector<Member> members = membership_->table().all();
            // Not this node's own host: a stranger there is no member.
            return std::any_of(members.begin() + 1, members.end(), [&](const Member& m) {
                const std::optional<HostPort> at = parse_host_port(m.address);
                return at && at->host == address;
            });
        },
        &reachability_->inbox());
    const uint16_t bound_port = gate_->port();
    try {
        address_ =
            choose_announce_address(config_.listen, config_.announce, bound_port, config_.seeds);
        membership_->set_address(address_);
        membership_->join_first(config_.seeds);
    } catch (...) {
        server_->Shutdown();
        throw;
    }
    spdlog::info("peer: node {} at {} in swarm '{}', {} member(s) known", format_node_id(node_id()),
                 address_, config_.swarm_id, members().size());
    running_ = true;
    reachability_->start();
    {
        // The protocol thread is not running yet: locked for the analysis, never waited for.
        MutexLock lock(run_mutex_);
        stopping_ = false;
    }
    thread_ = std::thread([this] { run(); });
}

namespace {

// `starling check`'s calls to a seed: from a throwaway identity, over a channel of their own.
struct StrangerCall {
    StrangerCall(const PeerConfig& config, const std::string& seed)
        : identity(NodeIdentity::generate()),
          auth(swarm_key_material(config), identity),
          channel(grpc::CreateChannel(seed, channel_credentials(config.tls, config.swarm_secret))) {
    }
    const NodeIdentity identity;
    const SwarmAuth auth;
    const std::shared_ptr<grpc::Channel> channel;
};

}  // namespace

SeedAnswer ask_seed(const PeerConfig& config, const std::string& seed,
                    std::chrono::milliseconds timeout) {
    const StrangerCall call(config, seed);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + timeout);
    call.auth.attach(context, "Ping");
    v1::PingRequest request;
    request.set_target_id(0);  // whoever answers
    v1::PingResponse response;
    const auto status = v1::Peer::NewStub(call.channel)->Ping(&context, request, &response);
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

DialBackResult ask_seed_to_dial_back(const PeerConfig& config, const std::string& seed,
                                     const std::string& address, DialBackInbox& inbox) {
    const StrangerCall call(config, seed);
    grpc::ClientContext context;
    return ask_dial_back(call.channel, call.auth, address, inbox, context);
}

void PeerNode::tick() {
    membership_->tick();
    anchor_links_->maintain(reachability_->verdict().state == Reachability::Private);
    std::set<uint64_t> members;
    for (const Member& m : membership_->table().all()) members.insert(m.node_id);
    rounds_->forget_departed(members);
    channels_.keep_only(membership_->addresses_in_use());
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
    rounds_->stop();
    reachability_->stop();
    {
        MutexLock lock(run_mutex_);
        stopping_ = true;
    }
    wake_.notify_all();
    thread_.join();
    anchor_links_->stop();
    if (announce) membership_->announce_leave();
    gate_->stop();
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
}

FailureCounts PeerNode::failures() const {
    FailureCounts totals = failures_.totals();
    // Handshakes are counted for the whole process, this node's calls and its server's alike.
    totals[static_cast<size_t>(FailureReason::Auth)] +=
        auth_.refusals() + failed_tls_handshakes() - tls_failures_before_;
    if (gate_) {
        totals[static_cast<size_t>(FailureReason::Connection)] += gate_->closed();
        totals[static_cast<size_t>(FailureReason::Auth)] += gate_->abandoned();
    }
    return totals;
}

FetchResult PeerNode::fetch_state(const SnapshotExpectation& expected,
                                  std::span<std::byte> destination, const FetchOptions& options) {
    if (!running_) throw Error("state sync: this node is not running");
    return state_sync_.fetch(membership_->table(), channels_.credentials(), expected, destination,
                             options);
}

}  // namespace starling
