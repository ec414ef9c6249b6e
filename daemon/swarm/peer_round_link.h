// The round link over gRPC (engine/round_link.h): a started PeerNode pairs, exchanges, publishes
// and gathers for a node's MemberRound. peer/ knows nothing of the engine; this adapter is the one
// place the two meet.
#pragma once

#include "engine/round_link.h"
#include "peer/peer_node.h"

namespace starling {

class PeerRoundLink : public RoundLink {
public:
    explicit PeerRoundLink(PeerNode& peer) : peer_(peer) {}

    // The partner chosen for the round (peer/pairing.h), within pair_timeout; it advertises the
    // round.
    std::vector<uint64_t> partners(uint64_t round) override;
    // Every part on a stream of its own at once, all within the exchange budget of `bytes` with
    // the partner (exchange_budget_with).
    std::vector<LinkExchanged> exchange(uint64_t round, uint64_t partner,
                                        std::vector<LinkPart> parts, uint64_t bytes,
                                        uint64_t tokens) override;
    // Repeated refusals quarantine the member (RoundPeers::judged).
    void judged(uint64_t member, uint64_t round,
                const std::optional<std::string>& refusal) override;
    // Every live compatible member, by node id. Gossiped rounds lag, so they decide nothing here:
    // a member still on an earlier round is waited for (up to T_xchg, DiLoCo being synchronous),
    // one that is past this round answers NOT_FOUND at once.
    std::vector<uint64_t> quorum(uint64_t round) override;
    // Advertises the round, then serves the message on the round message board.
    void publish(uint64_t round, std::shared_ptr<const codec::EncodedMessage> message,
                 uint64_t tokens) override;
    std::vector<LinkGathered> gather(uint64_t round, std::span<const uint64_t> members,
                                     std::span<codec::MessageDecoder* const> decoders,
                                     uint64_t* bytes) override;

private:
    PeerNode& peer_;
};

}  // namespace starling
