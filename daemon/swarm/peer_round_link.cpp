#include "daemon/swarm/peer_round_link.h"

#include <future>

namespace starling {

namespace {

OutgoingMessage outgoing(LinkMessage& message) {
    return {message.header, [&message](ChunkBuffer& out) { return message.next_chunk(*out); }};
}

LinkExchanged exchanged(const ExchangeResult& r) {
    return {r.received, r.bytes_sent, r.bytes_received, r.error, r.partner_tokens};
}

}  // namespace

std::vector<uint64_t> PeerRoundLink::partners(uint64_t round) {
    const std::optional<Member> partner = peer_.rounds().choose_partner(round);
    if (!partner) return {};
    return {partner->node_id};
}

std::vector<LinkExchanged> PeerRoundLink::exchange(uint64_t round, uint64_t partner,
                                                   std::vector<LinkPart> parts, uint64_t bytes,
                                                   uint64_t tokens) {
    // The parts share the link, and one deadline.
    const auto deadline = SteadyClock::now() + peer_.rounds().exchange_budget_with(partner, bytes);
    const auto slot = [&](uint32_t part) {
        return ExchangeSlot{
            round, partner, outgoing(parts[part].outgoing), parts[part].incoming, deadline,
            part,  tokens};
    };
    // Every part after the first on a stream of its own, at the same time. The exchange checks
    // that each message names the partner and this round.
    std::vector<std::future<ExchangeResult>> later;
    for (uint32_t part = 1; part < parts.size(); part++)
        later.push_back(std::async(std::launch::async,
                                   [&, part] { return peer_.rounds().exchange(slot(part)); }));
    std::vector<LinkExchanged> results{exchanged(peer_.rounds().exchange(slot(0)))};
    for (auto& result : later) results.push_back(exchanged(result.get()));
    return results;
}

void PeerRoundLink::judged(uint64_t member, uint64_t round,
                           const std::optional<std::string>& refusal) {
    peer_.rounds().judged(member, round, refusal);
}

std::vector<uint64_t> PeerRoundLink::quorum(uint64_t) { return peer_.pairable_ids(); }

void PeerRoundLink::publish(uint64_t round, std::shared_ptr<const codec::EncodedMessage> message,
                            uint64_t tokens) {
    peer_.rounds().publish(round, {std::move(message), tokens});
}

std::vector<LinkGathered> PeerRoundLink::gather(uint64_t round, std::span<const uint64_t> members,
                                                std::span<codec::MessageDecoder* const> decoders,
                                                uint64_t* bytes) {
    std::vector<LinkGathered> gathered;
    for (const RoundPeers::Gathered& g : peer_.rounds().gather(round, members, decoders, bytes))
        gathered.push_back({g.error, g.tokens});
    return gathered;
}

}  // namespace starling
