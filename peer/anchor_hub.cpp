#include "peer/anchor_hub.h"

#include <spdlog/spdlog.h>

#include "peer/identity.h"

namespace starling {

grpc::Status AnchorHub::serve(uint64_t caller, grpc::ServerContext& context,
                              AnchorServerStream& stream) {
    v1::AnchorUp hello;
    if (!stream.Read(&hello)) return {grpc::StatusCode::CANCELLED, "no hello"};
    if (hello.request() != 0 || hello.answer().self().node_id() != caller)
        return {grpc::StatusCode::PERMISSION_DENIED, "the hello must be the caller's own digest"};
    auto link = std::make_shared<Link>();
    link->context = &context;
    link->stream = &stream;
    {
        MutexLock lock(mutex_);
        auto& slot = links_[caller];
        if (slot) {
            slot->context->TryCancel();  // its Read ends and it leaves the slot to this one
        } else if (links_.size() > kAnchorStreamsMax) {
            links_.erase(caller);
            return {grpc::StatusCode::RESOURCE_EXHAUSTED,
                    "this node already anchors " + std::to_string(kAnchorStreamsMax) + " members"};
        }
        slot = link;
    }
    {
        MutexLock lock(link->mutex);
        stream.Write(v1::AnchorDown{});  // request 0: held
    }
    spdlog::info("peer: anchoring node {}", format_node_id(caller));
    for (v1::AnchorUp up; stream.Read(&up);) {
        MutexLock lock(link->mutex);
        if (auto it = link->waiting.find(up.request()); it != link->waiting.end()) {
            it->second = std::move(up);
            link->answered.notify_all();
        }
    }
    end(caller, link);
    spdlog::info("peer: no longer anchoring node {}", format_node_id(caller));
    return grpc::Status::OK;
}

void AnchorHub::end(uint64_t member, const std::shared_ptr<Link>& link) {
    {
        MutexLock lock(mutex_);
        if (auto it = links_.find(member); it != links_.end() && it->second == link)
            links_.erase(it);
    }
    MutexLock lock(link->mutex);
    link->ended = true;
    link->answered.notify_all();
}

bool AnchorHub::holds(uint64_t member) const {
    MutexLock lock(mutex_);
    return links_.contains(member);
}

size_t AnchorHub::streams() const {
    MutexLock lock(mutex_);
    return links_.size();
}

std::optional<v1::PingResponse> AnchorHub::ping(uint64_t member,
                                                std::chrono::milliseconds timeout) {
    v1::AnchorDown down;
    down.mutable_ping()->set_target_id(member);
    auto up = call(member, std::move(down), timeout);
    if (!up) return std::nullopt;
    ++pings_answered_;
    return std::move(*up->mutable_answer());
}

std::optional<v1::PairResponse> AnchorHub::pair(uint64_t member, uint64_t proposer,
                                                const v1::PairRequest& request,
                                                std::chrono::milliseconds timeout) {
    v1::AnchorDown down;
    *down.mutable_pair() = request;
    down.set_proposer(proposer);
    auto up = call(member, std::move(down), timeout);
    if (!up) return std::nullopt;
    ++proposals_relayed_;
    return std::move(*up->mutable_pair_answer());
}

std::optional<v1::AnchorUp> AnchorHub::call(uint64_t member, v1::AnchorDown down,
                                            std::chrono::milliseconds timeout) {
    std::shared_ptr<Link> link;
    {
        MutexLock lock(mutex_);
        const auto it = links_.find(member);
        if (it == links_.end()) return std::nullopt;
        link = it->second;
    }
    MutexLock lock(link->mutex);
    if (link->ended) return std::nullopt;
    const uint64_t request = link->next_request++;
    down.set_request(request);
    link->waiting[request];
    // Small, and the stream's window is far larger: the write does not wait on the member.
    if (!link->stream->Write(down)) {
        link->waiting.erase(request);
        return std::nullopt;
    }
    lock.wait_for(link->answered, timeout,
                  [&] { return link->ended || link->waiting.at(request).has_value(); });
    std::optional<v1::AnchorUp> answer = std::move(link->waiting.at(request));
    link->waiting.erase(request);
    return answer;
}

}  // namespace starling
