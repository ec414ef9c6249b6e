#include "peer/anchor_links.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "peer/anchors.h"
#include "peer/identity.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {

AnchorLinks::AnchorLinks(MemberTable& table, PeerChannels& channels, const SwarmAuth& auth,
                         RoundTrip round_trip_ms, Answer answer, AnswerPair answer_pair)
    : table_(table),
      channels_(channels),
      auth_(auth),
      round_trip_ms_(std::move(round_trip_ms)),
      answer_(std::move(answer)),
      answer_pair_(std::move(answer_pair)) {}

AnchorLinks::~AnchorLinks() { stop(); }

void AnchorLinks::run(Link& link, const std::string& address) {
    auth_.attach(link.context, "Anchor");
    auto stream = v1::Peer::NewStub(channels_.get(address))->Anchor(&link.context);
    v1::AnchorUp hello;
    answer_(v1::PingRequest{}, hello.mutable_answer());
    if (stream->Write(hello)) {
        for (v1::AnchorDown down; stream->Read(&down);) {
            if (down.request() == 0) {
                link.held = true;
                continue;
            }
            v1::AnchorUp up;
            up.set_request(down.request());
            if (down.has_pair())
                answer_pair_(down.proposer(), down.pair(), up.mutable_pair_answer());
            else
                answer_(down.ping(), up.mutable_answer());
            if (!stream->Write(up)) break;
        }
    }
    link.status = stream->Finish();
    link.ended = true;
}

void AnchorLinks::reap(SteadyClock::time_point now) {
    for (auto it = links_.begin(); it != links_.end();) {
        Link& link = *it->second;
        if (!link.ended) {
            ++it;
            continue;
        }
        link.thread.join();
        if (!link.held) refused_until_[it->first] = now + kRefusedFor;
        spdlog::info("peer: anchor {} ended this node's stream: {}", format_node_id(it->first),
                     link.status.error_message().empty() ? "closed" : link.status.error_message());
        it = links_.erase(it);
    }
    std::erase_if(refused_until_, [&](const auto& entry) { return entry.second <= now; });
}

void AnchorLinks::drop(uint64_t anchor) {
    const auto it = links_.find(anchor);
    if (it == links_.end()) return;
    it->second->context.TryCancel();
    it->second->thread.join();
    links_.erase(it);
}

void AnchorLinks::maintain(bool is_private) {
    const auto now = SteadyClock::now();
    reap(now);
    if (!is_private) {
        stop();
        table_.set_anchors({});
        return;
    }
    std::vector<uint64_t> current;
    for (const auto& [id, link] : links_) current.push_back(id);
    if (!anchors_hold(table_, current)) {
        std::set<uint64_t> refused;
        for (const auto& [id, until] : refused_until_) refused.insert(id);
        const std::vector<uint64_t> wanted = choose_anchors(
            table_.self().node_id, table_.reachable_others(), current, round_trip_ms_, refused);
        for (const uint64_t id : current)
            if (std::find(wanted.begin(), wanted.end(), id) == wanted.end()) drop(id);
        for (const uint64_t id : wanted) {
            const auto anchor = table_.find(id);
            if (links_.contains(id) || !anchor) continue;
            auto& link = links_[id];
            link = std::make_unique<Link>();
            link->thread = std::thread(
                [this, &held = *link, address = anchor->address] { run(held, address); });
        }
    }
    std::vector<uint64_t> held;
    for (const auto& [id, link] : links_)
        if (link->held && !link->ended) held.push_back(id);
    table_.set_anchors(std::move(held));
}

void AnchorLinks::stop() {
    for (auto& [id, link] : links_) link->context.TryCancel();
    for (auto& [id, link] : links_) link->thread.join();
    links_.clear();
}

}  // namespace starling
