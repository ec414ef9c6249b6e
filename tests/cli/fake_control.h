// A stand-in for starlingd's Control service on 127.0.0.1 that answers what the test sets, so
// the client's handling of every outcome is checked without a daemon.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "starling/v1/control.grpc.pb.h"

namespace starling::test {

class FakeControl final : public v1::Control::Service {
public:
    // Set before the first call.
    v1::NodeStatus status;
    grpc::Status unary_result = grpc::Status::OK;  // every unary call ends with it
    int watch_updates = -1;  // updates before the stream ends; -1: until cancelled
    v1::NodePhase last_phase = v1::NODE_PHASE_TRAINING;  // of the last update before the end
    grpc::Status watch_result = grpc::Status::OK;

    // Seen by the service.
    std::vector<std::string> seeds_seen;
    uint32_t interval_seen = 0;

    grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                           v1::NodeStatus* out) override {
        *out = status;
        return unary_result;
    }
    grpc::Status ListPeers(grpc::ServerContext*, const v1::ListPeersRequest*,
                           v1::ListPeersResponse* out) override {
        out->add_peers()->set_node_id("aaaaaaaaaaaaaaaa");
        return unary_result;
    }
    grpc::Status Join(grpc::ServerContext*, const v1::JoinSwarmRequest* request,
                      v1::JoinSwarmResponse* out) override {
        seeds_seen.assign(request->seeds().begin(), request->seeds().end());
        out->set_seeds_added(static_cast<uint32_t>(request->seeds_size()));
        return unary_result;
    }
    grpc::Status Leave(grpc::ServerContext*, const v1::LeaveSwarmRequest*,
                       v1::LeaveSwarmResponse*) override {
        return unary_result;
    }
    grpc::Status Watch(grpc::ServerContext* context, const v1::WatchRequest* request,
                       grpc::ServerWriter<v1::NodeStatus>* writer) override {
        interval_seen = request->interval_ms();
        for (int i = 0; watch_updates < 0 || i < watch_updates; ++i) {
            if (context->IsCancelled()) return grpc::Status::CANCELLED;
            v1::NodeStatus update = status;
            update.set_round(static_cast<uint64_t>(i));
            if (i + 1 == watch_updates) update.set_phase(last_phase);
            if (!writer->Write(update)) return grpc::Status::CANCELLED;
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return watch_result;
    }
};

// The fake served on a free port of 127.0.0.1.
class FakeNode {
public:
    FakeNode() {
        grpc::ServerBuilder builder;
        int port = 0;
        builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
        builder.RegisterService(&service);
        server_ = builder.BuildAndStart();
        address_ = "127.0.0.1:" + std::to_string(port);
    }
    ~FakeNode() { server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1)); }
    FakeNode(const FakeNode&) = delete;
    FakeNode& operator=(const FakeNode&) = delete;

    const std::string& address() const { return address_; }

    FakeControl service;

private:
    std::unique_ptr<grpc::Server> server_;
    std::string address_;
};

}  // namespace starling::test
