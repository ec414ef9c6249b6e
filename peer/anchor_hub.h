// The anchor's side of peer/anchors.h: the Anchor streams private members hold open to this
// node, and the calls for those members sent down them. A probe of such a member, this node's own
// or one asked of it (PingReq), goes over its stream (MembershipProtocol::ping), and so does a
// proposal another member asks this node to relay (RelayPair).
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/sync_stream.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "common/mutex.h"
#include "peer/anchors.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {

using AnchorServerStream = grpc::ServerReaderWriter<v1::AnchorDown, v1::AnchorUp>;

class AnchorHub {
public:
    // The stream of `caller`, whose proof of membership was checked, until it ends or this node
    // stops. A second stream from one member replaces its first.
    grpc::Status serve(uint64_t caller, grpc::ServerContext& context, AnchorServerStream& stream);
    bool holds(uint64_t member) const;
    // The member's answer to a ping sent down its stream, or nullopt when it holds none here or
    // no answer came within `timeout`.
    std::optional<v1::PingResponse> ping(uint64_t member, std::chrono::milliseconds timeout);
    // The member's answer to `proposer`'s proposal, passed down its stream; nullopt likewise.
    std::optional<v1::PairResponse> pair(uint64_t member, uint64_t proposer,
                                         const v1::PairRequest& request,
                                         std::chrono::milliseconds timeout);
    size_t streams() const;
    // Pings and proposals sent down streams that their members answered in time, since the start.
    uint64_t pings_answered() const { return pings_answered_; }
    uint64_t proposals_relayed() const { return proposals_relayed_; }

private:
    struct Link {
        grpc::ServerContext* context = nullptr;
        AnchorServerStream* stream = nullptr;
        Mutex mutex;  // one writer at a time; the answers below
        std::condition_variable answered;
        uint64_t next_request = 1;
        bool ended = false;
        std::map<uint64_t, std::optional<v1::AnchorUp>> waiting;
    };
    void end(uint64_t member, const std::shared_ptr<Link>& link);
    // Sends `down` with a fresh request id; the member's answer to it, if in within `timeout`.
    std::optional<v1::AnchorUp> call(uint64_t member, v1::AnchorDown down,
                                     std::chrono::milliseconds timeout);

    std::atomic<uint64_t> pings_answered_{0}, proposals_relayed_{0};
    mutable Mutex mutex_;
    std::map<uint64_t, std::shared_ptr<Link>> links_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace starling
