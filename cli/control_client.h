// The operator's side of the Control API (proto/starling/v1/control.proto): one local node, plain
// gRPC (the API listens on 127.0.0.1 or a unix socket, so there is nothing to encrypt), and the
// mapping from a call's outcome to the exit status every command shares.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mutex.h"
#include "starling/v1/control.grpc.pb.h"

namespace starling::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;        // bad input, a failed check, an error from the node
inline constexpr int kExitUnreachable = 2;  // no node answered at the control address

inline constexpr const char* kDefaultControlAddress = "127.0.0.1:7701";

// STARLING_CONTROL when set and not empty, else kDefaultControlAddress.
std::string default_control_address();

// Whether text is a seed a node can dial: host:port or [v6]:port with a port of 1-65535.
bool is_seed_address(std::string_view text);
// Whether text can name a Control API: a seed-like host:port, or a gRPC target with its scheme
// (unix:/path, unix-abstract:, dns:, ipv4:, ipv6:).
bool is_control_address(std::string_view text);

// What a finished call means for the exit status. A unary call that runs out of time counts as an
// unreachable node: the Control API answers at once, so a silent one is not really there.
int exit_code_for(const grpc::Status& status, bool unary);

// The line to print for a failed call: "error: ..." with the node's own message, or the advice
// to check the address when it could not be reached.
std::string failure_message(const grpc::Status& status, bool unary, std::string_view address);

// Why a Watch stream ended and what to tell the operator.
enum class WatchEnd {
    Counted,   // the requested number of updates arrived
    Stopped,   // the operator pressed Ctrl-C (or stop() was called)
    NodeLeft,  // the node finished its stream or went away after draining
    Failed,    // any other status: see the returned status
};

class ControlClient {
public:
    explicit ControlClient(std::string address);

    const std::string& address() const { return address_; }

    // Unary calls, each bounded by kUnaryDeadline.
    grpc::Status get_status(v1::NodeStatus& out);
    grpc::Status list_peers(v1::ListPeersResponse& out);
    grpc::Status join(const std::vector<std::string>& seeds, v1::JoinSwarmResponse& out);
    grpc::Status leave();
    // The node's model, message by message (no deadline: gigabytes take their time on a slow disk
    // or a remote control address).
    grpc::Status get_model(const std::function<void(const v1::ModelChunk&)>& on_chunk);

    // Streams status updates to on_update (no deadline: a watch lasts as long as the operator
    // wants) until max_updates have arrived (0: no limit), stop() is called or the stream ends.
    // status receives the stream's final status when it ended by itself.
    WatchEnd watch(uint32_t interval_ms, uint64_t max_updates,
                   const std::function<void(const v1::NodeStatus&)>& on_update,
                   grpc::Status& status);
    // Ends a watch in progress from another thread; safe to call at any time.
    void stop();

    static constexpr std::chrono::seconds kUnaryDeadline{5};

private:
    std::string address_;
    std::unique_ptr<v1::Control::Stub> stub_;
    Mutex watch_mutex_;
    // The watch in progress.
    grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(watch_mutex_) = nullptr;
    std::atomic<bool> stopped_{false};
};

}  // namespace starling::cli
