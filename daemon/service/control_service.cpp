#include "daemon/service/control_service.h"

#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>
#include <spdlog/spdlog.h>

#include <cstring>
#include <span>
#include <string_view>
#include <thread>

#include "common/error.h"
#include "daemon/swarm/swarm_snapshot.h"
#include "model/hf_format.h"
#include "peer/address.h"
#include "peer/grpc_log.h"

namespace starling {

namespace {

// The Control server's threads and the streams one connection may have open at once.
constexpr int kMaxControlThreads = 16;
constexpr int kMaxControlStreams = 16;

// The seeds of a Join are dialled before the node answers, so they must be done while the caller
// still waits (`starling join` waits 5 s): its deadline less this, for the answer's way back.
constexpr std::chrono::milliseconds kJoinAnswerMargin{500};

std::chrono::steady_clock::time_point join_deadline(const grpc::ServerContext& context) {
    const auto left = context.deadline() - std::chrono::system_clock::now();
    // A caller without a deadline (grpcurl) waits as long as the dialling takes: each address
    // has its own bound of 4 probe timeouts.
    if (left > std::chrono::hours(1)) return std::chrono::steady_clock::time_point::max();
    return std::chrono::steady_clock::now() +
           std::chrono::duration_cast<std::chrono::steady_clock::duration>(left) -
           kJoinAnswerMargin;
}

}  // namespace

class ControlServer::Service final : public v1::Control::Service {
public:
    Service(NodeState& state, const SwarmNode& node, const ModelConfig& model,
            std::string tokenizer_json, ControlHandlers handlers, const std::atomic<bool>& stopping)
        : state_(state),
          node_(node),
          model_json_(llama_config_json(model).dump()),
          tokenizer_json_(std::move(tokenizer_json)),
          handlers_(std::move(handlers)),
          stopping_(stopping) {}

    grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                           v1::NodeStatus* response) override {
        *response = state_.status(node_.view());
        return grpc::Status::OK;
    }

    grpc::Status ListPeers(grpc::ServerContext*, const v1::ListPeersRequest*,
                           v1::ListPeersResponse* response) override {
        *response = state_.peers(node_.view());
        return grpc::Status::OK;
    }

    grpc::Status Join(grpc::ServerContext* context, const v1::JoinSwarmRequest* request,
                      v1::JoinSwarmResponse* response) override {
        if (request->seeds().empty()) return {grpc::StatusCode::INVALID_ARGUMENT, "no seed given"};
        std::vector<std::string> seeds;
        for (const std::string& seed : request->seeds()) {
            const auto parsed = parse_host_port(seed);
            if (!parsed || parsed->port == 0)
                return {grpc::StatusCode::INVALID_ARGUMENT,
                        "seed \"" + seed + "\" is not host:port"};
            seeds.push_back(parsed->str());
        }
        const std::vector<std::string> problems = handlers_.join(seeds, join_deadline(*context));
        uint32_t joined = 0;
        for (size_t i = 0; i < seeds.size(); i++) {
            v1::SeedOutcome* outcome = response->add_seeds();
            outcome->set_seed(seeds[i]);
            outcome->set_joined(problems[i].empty());
            outcome->set_error(problems[i]);
            joined += problems[i].empty();
        }
        response->set_seeds_added(joined);
        return grpc::Status::OK;
    }

    grpc::Status Leave(grpc::ServerContext*, const v1::LeaveSwarmRequest*,
                       v1::LeaveSwarmResponse*) override {
        handlers_.leave();
        return grpc::Status::OK;
    }

    grpc::Status Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                       grpc::ServerWriter<v1::NodeStatus>* writer) override {
        const auto interval =
            std::chrono::milliseconds(request->interval_ms() ? request->interval_ms() : 1000);
        if (interval < std::chrono::milliseconds(50))
            return {grpc::StatusCode::INVALID_ARGUMENT, "interval_ms must be at least 50"};
        auto next = std::chrono::steady_clock::now();
        while (!context->IsCancelled() && !stopping_.load()) {
            if (!writer->Write(state_.status(node_.view()))) break;
            next += interval;
            // Short sleeps, so a shutdown or a cancelled caller ends the stream promptly.
            while (std::chrono::steady_clock::now() < next && !context->IsCancelled() &&
                   !stopping_.load())
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return grpc::Status::OK;
    }

    grpc::Status GetModel(grpc::ServerContext* context, const v1::GetModelRequest*,
                          grpc::ServerWriter<v1::ModelChunk>* writer) override {
        // Held to the end, so the node does not refill these bytes for a later round meanwhile.
        const std::shared_ptr<const Snapshot> snapshot = node_.latest_snapshot();
        if (!snapshot)
            return {grpc::StatusCode::FAILED_PRECONDITION,
                    "the node has no state to give yet (it is starting or copying the swarm's)"};
        const std::span<const std::byte> bytes = snapshot->bytes();
        uint64_t n = 0;
        if (bytes.size() >= kSwarmSnapshotHeaderBytes) std::memcpy(&n, bytes.data() + 24, sizeof n);
        if (bytes.size() != swarm_snapshot_bytes(n))
            return {grpc::StatusCode::INTERNAL, "the node's snapshot does not have its own layout"};
        const std::span<const std::byte> phi =
            bytes.subspan(kSwarmSnapshotHeaderBytes, n * sizeof(float));
        constexpr size_t kChunkBytes = 1 << 20;
        v1::ModelChunk chunk;
        chunk.set_llama_config_json(model_json_);
        chunk.set_tokenizer_json(tokenizer_json_);
        chunk.set_round(snapshot->round());
        chunk.set_parameters(n);
        size_t at = 0;
        do {  // the first message goes out even for no weights at all
            if (context->IsCancelled() || stopping_.load())
                return {grpc::StatusCode::CANCELLED, "the node is stopping"};
            const std::span<const std::byte> part =
                phi.subspan(at, std::min(kChunkBytes, phi.size() - at));
            chunk.set_phi(part.data(), part.size());
            if (!writer->Write(chunk)) return {grpc::StatusCode::CANCELLED, "the caller went away"};
            chunk.Clear();
            at += part.size();
        } while (at < phi.size());
        return grpc::Status::OK;
    }

private:
    NodeState& state_;
    const SwarmNode& node_;
    std::string model_json_;
    std::string tokenizer_json_;
    ControlHandlers handlers_;
    const std::atomic<bool>& stopping_;
};

ControlServer::ControlServer(const std::string& address, NodeState& state, const SwarmNode& node,
                             const ModelConfig& model, std::string tokenizer_json,
                             ControlHandlers handlers)
    : address_(address),
      service_(std::make_unique<Service>(state, node, model, std::move(tokenizer_json),
                                         std::move(handlers), stopping_)) {
    grpc::ServerBuilder builder;
    int port = 0;
    std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> acceptor;
    // A unix socket's file mode decides who may connect; a TCP port is open to every local user,
    // so its connections pass the gate (control_gate.h).
    const bool unix_socket = address.rfind("unix:", 0) == 0;
    if (unix_socket) {
        builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
    } else {
        gate_ = std::make_unique<ControlGate>(address);
        acceptor = builder.experimental().AddExternalConnectionAcceptor(
            grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD,
            grpc::InsecureServerCredentials());
    }
    builder.RegisterService(service_.get());
    // gRPC's sync server starts a thread for every call it cannot hand to an idle one: past the
    // cap it answers RESOURCE_EXHAUSTED. Control calls are short and few callers use them at once.
    grpc::ResourceQuota quota("starling-control");
    quota.SetMaxThreads(kMaxControlThreads);
    builder.SetResourceQuota(quota);
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, kMaxControlStreams);
    {
        // gRPC logs a unix socket it cannot bind itself, at ERROR, as a raw error tree, before
        // BuildAndStart returns; the line below says the same naming [control].listen.
        const QuietGrpcSource quiet("chttp2_server.cc");
        server_ = builder.BuildAndStart();
    }
    if (!server_) throw Error("[control].listen: cannot listen on " + address);
    if (gate_) {
        gate_->start(std::move(acceptor));
        if (const auto parsed = parse_host_port(address))
            address_ = HostPort{parsed->host, gate_->port()}.str();
    }
    spdlog::info("control: listening on {}", address_);
}

ControlServer::~ControlServer() { shutdown(std::chrono::milliseconds(1000)); }

void ControlServer::set_serving(bool serving) {
    if (server_->GetHealthCheckService())
        server_->GetHealthCheckService()->SetServingStatus(serving);
}

void ControlServer::shutdown(std::chrono::milliseconds grace) {
    if (stopping_.exchange(true)) return;
    if (gate_) gate_->stop_reading();
    server_->Shutdown(std::chrono::system_clock::now() + grace);
    if (gate_) gate_->stop();
}

}  // namespace starling
