// The Control gRPC service (proto/starling/v1/control.proto) on its own server, with the standard
// health service and server reflection beside it, so grpcurl and Kubernetes probes work. It reads
// NodeState and the SwarmNode (its view of the swarm; GetModel: the newest snapshot it
// publishes); Join and Leave are handed to the node's owner.
#pragma once

#include <grpcpp/server.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "daemon/service/control_gate.h"
#include "daemon/service/node_state.h"
#include "model/config.h"
#include "daemon/swarm/swarm_node.h"
#include "starling/v1/control.grpc.pb.h"

namespace starling {

struct ControlHandlers {
    // Dials the seeds before `by`; per seed, "" when the node joined through it, else why not.
    std::function<std::vector<std::string>(const std::vector<std::string>& seeds,
                                           std::chrono::steady_clock::time_point by)>
        join;
    std::function<void()> leave;  // starts the drain; returns at once
};

class ControlServer {
public:
    // Listens on `address` (host:port or unix:/path); throws starling::Error naming it when it
    // cannot. grpc::EnableDefaultHealthCheckService(true) must have been called before.
    // model and tokenizer_json: the node's, for GetModel's config.json and tokenizer.json.
    ControlServer(const std::string& address, NodeState& state, const SwarmNode& node,
                  const ModelConfig& model, std::string tokenizer_json, ControlHandlers handlers);
    ~ControlServer();
    // What the health service reports; NOT_SERVING once the node drains.
    void set_serving(bool serving);
    // Ends Watch streams and stops serving, waiting at most `grace` for calls in flight.
    void shutdown(std::chrono::milliseconds grace);
    const std::string& address() const { return address_; }
    // Connections the gate in front of a TCP address closed; 0 on a unix socket, which has none.
    uint64_t closed_connections() const { return gate_ ? gate_->closed() : 0; }

private:
    class Service;
    std::string address_;
    std::atomic<bool> stopping_{false};
    std::unique_ptr<Service> service_;
    std::unique_ptr<ControlGate> gate_;  // in front of a TCP port; none for a unix socket
    std::unique_ptr<grpc::Server> server_;
};

}  // namespace starling
