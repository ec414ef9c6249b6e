#include "cli/control_client.h"

#include <cctype>
#include <cstdlib>

#include <algorithm>
#include <fmt/format.h>

#include "peer/address.h"

namespace starling::cli {

namespace {

std::shared_ptr<grpc::Channel> control_channel(const std::string& address) {
    grpc::ChannelArguments args;
    // The node is on this machine: an http_proxy meant for the internet must not be used to reach
    // it.
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

void set_unary_deadline(grpc::ClientContext& context) {
    context.set_deadline(std::chrono::system_clock::now() + ControlClient::kUnaryDeadline);
}

}  // namespace

std::string default_control_address() {
    const char* env = std::getenv("STARLING_CONTROL");
    return env != nullptr && *env != '\0' ? std::string(env) : std::string(kDefaultControlAddress);
}

bool is_seed_address(std::string_view text) {
    const auto parsed = parse_host_port(text);
    if (!parsed || parsed->port == 0) return false;
    return std::none_of(parsed->host.begin(), parsed->host.end(), [](unsigned char c) {
        return std::isspace(c) != 0 || std::iscntrl(c) != 0;
    });
}

bool is_control_address(std::string_view text) {
    for (const std::string_view scheme : {"unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:"})
        if (text.size() > scheme.size() && text.substr(0, scheme.size()) == scheme) return true;
    return is_seed_address(text);
}

int exit_code_for(const grpc::Status& status, bool unary) {
    if (status.ok()) return kExitOk;
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) return kExitUnreachable;
    if (unary && status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        return kExitUnreachable;
    return kExitError;
}

std::string failure_message(const grpc::Status& status, bool unary, std::string_view address) {
    if (exit_code_for(status, unary) == kExitUnreachable)
        return fmt::format(
            "error: cannot reach starlingd at {} (is it running? --control or STARLING_CONTROL)",
            address);
    if (status.error_message().empty())
        return fmt::format("error: starlingd at {} answered with status code {}", address,
                           static_cast<int>(status.error_code()));
    return "error: " + status.error_message();
}

ControlClient::ControlClient(std::string address)
    : address_(std::move(address)), stub_(v1::Control::NewStub(control_channel(address_))) {}

grpc::Status ControlClient::get_status(v1::NodeStatus& out) {
    grpc::ClientContext context;
    set_unary_deadline(context);
    return stub_->GetStatus(&context, v1::GetStatusRequest(), &out);
}

grpc::Status ControlClient::list_peers(v1::ListPeersResponse& out) {
    grpc::ClientContext context;
    set_unary_deadline(context);
    return stub_->ListPeers(&context, v1::ListPeersRequest(), &out);
}

grpc::Status ControlClient::join(const std::vector<std::string>& seeds,
                                 v1::JoinSwarmResponse& out) {
    grpc::ClientContext context;
    set_unary_deadline(context);
    v1::JoinSwarmRequest request;
    for (const std::string& seed : seeds) request.add_seeds(seed);
    return stub_->Join(&context, request, &out);
}

grpc::Status ControlClient::leave() {
    grpc::ClientContext context;
    set_unary_deadline(context);
    v1::LeaveSwarmResponse response;
    return stub_->Leave(&context, v1::LeaveSwarmRequest(), &response);
}

grpc::Status ControlClient::get_model(const std::function<void(const v1::ModelChunk&)>& on_chunk) {
    grpc::ClientContext context;
    const auto reader = stub_->GetModel(&context, v1::GetModelRequest());
    v1::ModelChunk chunk;
    while (reader->Read(&chunk)) on_chunk(chunk);
    return reader->Finish();
}

WatchEnd ControlClient::watch(uint32_t interval_ms, uint64_t max_updates,
                              const std::function<void(const v1::NodeStatus&)>& on_update,
                              grpc::Status& status) {
    grpc::ClientContext context;
    {
        const MutexLock lock(watch_mutex_);
        if (stopped_) return WatchEnd::Stopped;
        watch_context_ = &context;
    }
    v1::WatchRequest request;
    request.set_interval_ms(interval_ms);
    const auto reader = stub_->Watch(&context, request);
    v1::NodeStatus update;
    uint64_t received = 0;
    bool counted = false;
    bool draining = false;
    while (reader->Read(&update)) {
        on_update(update);
        draining = update.phase() == v1::NODE_PHASE_DRAINING;
        if (max_updates != 0 && ++received >= max_updates) {
            counted = true;
            context.TryCancel();  // Finish() would otherwise wait for the node to end the stream
            break;
        }
    }
    status = reader->Finish();
    {
        const MutexLock lock(watch_mutex_);
        watch_context_ = nullptr;
    }
    if (counted) return WatchEnd::Counted;
    if (stopped_) return WatchEnd::Stopped;
    if (status.ok()) return WatchEnd::NodeLeft;
    // A draining node shuts its server down: the stream is cancelled or the connection drops.
    const bool gone = status.error_code() == grpc::StatusCode::CANCELLED ||
                      status.error_code() == grpc::StatusCode::UNAVAILABLE;
    return draining && gone ? WatchEnd::NodeLeft : WatchEnd::Failed;
}

void ControlClient::stop() {
    const MutexLock lock(watch_mutex_);
    stopped_ = true;
    if (watch_context_ != nullptr) watch_context_->TryCancel();
}

}  // namespace starling::cli
