#include "peer/exchange_relay.h"

#include <algorithm>
#include <string>

#include "peer/membership.h"

namespace starling {
namespace {

constexpr std::chrono::milliseconds kCancelCheck{100};

uint64_t wire_bytes(const ExchangeWireFrame& frame) {
    return frame.fields.ByteSizeLong() + (frame.has_chunk ? frame.chunk->size() : 0);
}

}  // namespace

grpc::Status ExchangeRelay::serve(grpc::ServerContext& context, ExchangeServerStream& stream,
                                  uint64_t caller, uint64_t partner,
                                  SteadyClock::time_point meet_by) {
    if (bytes_per_s_ <= 0)
        return {grpc::StatusCode::RESOURCE_EXHAUSTED,
                "this node relays no exchange ([peer].relay_mbit is 0)"};
    ExchangeWireFrame first;
    if (!stream.Read(&first))
        return {grpc::StatusCode::INVALID_ARGUMENT, "the stream ended before its first frame"};
    const uint64_t round = first.fields.round();
    const Key key{std::min(caller, partner), std::max(caller, partner), round, first.fields.part()};
    const std::string what = "the exchange of nodes " + format_node_id(caller) + " and " +
                             format_node_id(partner) + " for round " + std::to_string(round);
    std::shared_ptr<Meeting> meeting;
    int mine = 0;
    {
        MutexLock lock(mutex_);
        if (stopped_) return {grpc::StatusCode::UNAVAILABLE, "this node is stopping"};
        if (const auto it = meetings_.find(key); it != meetings_.end()) {
            meeting = it->second;
            if (meeting->met || meeting->first == caller)
                return {grpc::StatusCode::ALREADY_EXISTS, what + " is already open here"};
            mine = 1;
            meeting->met = true;
            changed_.notify_all();
        } else {
            if (meetings_.size() >= kRelayedExchangesMax)
                return {grpc::StatusCode::RESOURCE_EXHAUSTED,
                        "this node already relays " + std::to_string(kRelayedExchangesMax) +
                            " exchanges, as many as it takes"};
            meeting = std::make_shared<Meeting>();
            meeting->first = caller;
            meetings_.emplace(key, meeting);
        }
        meeting->sides[mine] = {&context, &stream, false};
        if (mine == 0) {
            // Nothing signals a cancelled call (its caller gave up): it is looked at now and then.
            while (!stopped_ && !meeting->met && !context.IsCancelled() &&
                   SteadyClock::now() < meet_by)
                lock.wait_until(changed_, std::min(meet_by, SteadyClock::now() + kCancelCheck));
            if (!meeting->met) {
                meetings_.erase(key);
                if (stopped_) return {grpc::StatusCode::UNAVAILABLE, "this node is stopping"};
                return {grpc::StatusCode::DEADLINE_EXCEEDED, "node " + format_node_id(partner) +
                                                                 " did not come to the relay for " +
                                                                 "round " + std::to_string(round)};
            }
            ++exchanges_relayed_;
        }
    }
    Side& from = meeting->sides[mine];
    Side& to = meeting->sides[1 - mine];
    const bool whole = pass_on(from, to, first);
    MutexLock lock(mutex_);
    from.through = true;
    if (!whole && !meeting->broken) {
        meeting->broken = true;
        to.context->TryCancel();
    }
    changed_.notify_all();
    // This handler's stream stays open until the other side's frames are through: they are
    // written to it from the other handler's thread.
    lock.wait(changed_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return to.through; });
    if (--meeting->left == 0) meetings_.erase(key);
    if (meeting->broken) return {grpc::StatusCode::ABORTED, what + " broke off at the relay"};
    return grpc::Status::OK;
}

bool ExchangeRelay::pass_on(Side& from, Side& to, ExchangeWireFrame& first) {
    RelayPacer::Flow flow(pacer_);
    ExchangeWireFrame frame = std::move(first);
    do {
        const uint64_t bytes = wire_bytes(frame);
        const auto leaves = flow.admit(bytes, SteadyClock::now());
        {
            MutexLock lock(mutex_);
            lock.wait_until(changed_, leaves, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
                return stopped_ || SteadyClock::now() >= leaves;
            });
            if (stopped_) return false;
        }
        if (!to.stream->Write(frame)) return false;
        bytes_relayed_ += bytes;
    } while (from.stream->Read(&frame));
    return !from.context->IsCancelled();
}

void ExchangeRelay::stop() {
    MutexLock lock(mutex_);
    stopped_ = true;
    for (auto& [key, meeting] : meetings_)
        for (Side& side : meeting->sides)
            if (side.context) side.context->TryCancel();
    changed_.notify_all();
}

}  // namespace starling
