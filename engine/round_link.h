// The network as one member's round sees it (engine/member_round.h, docs/round.md): who to
// exchange with, the exchange itself, DiLoCo's publish and gather, and what the outer step made of
// a partner's message. Two implementations: in-process (engine/in_process_link.h, the
// experiment's replicas in one process) and gRPC (daemon/swarm/peer_round_link.h, a PeerNode).
// The round's code is written once against this; the links only move bytes.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/message.h"

namespace starling {

// A message as a link sends it: its header, then its chunks in order; next_chunk writes the next
// one into its argument and returns false after the last.
struct LinkMessage {
    std::vector<std::byte> header;
    std::function<bool(std::vector<std::byte>&)> next_chunk;
};

// A message streamed from an encoder as the link asks for chunks; the encoder must outlive it.
LinkMessage streamed_message(codec::MessageEncoder& encoder);
// A message encoded whole, sent again to each partner that asks.
LinkMessage stored_message(std::shared_ptr<const codec::EncodedMessage> message);
// Every chunk of `message`, taken as a link sends it.
codec::EncodedMessage drained_message(LinkMessage& message);

// One of a round's messages with a partner (split mode sends two at once: D as part 0, phi as
// part 1): what this member sends, and the decoder the partner's message of the same part goes to.
struct LinkPart {
    LinkMessage outgoing;
    codec::MessageDecoder& incoming;
};

// How one part of an exchange went.
struct LinkExchanged {
    bool received = false;        // the partner's whole message arrived and decoded
    uint64_t bytes_sent = 0;      // header and chunk bytes this member sent
    uint64_t bytes_received = 0;  // header and chunk bytes it read
    std::string error;            // why not, when nothing or not all arrived
    uint64_t partner_tokens = 0;  // what the partner said it trained on; 0: nothing said
};

// A DiLoCo member's message as gathered: error "" when it arrived whole.
struct LinkGathered {
    std::string error;
    uint64_t tokens = 0;
};

class RoundLink {
public:
    virtual ~RoundLink() = default;

    // NoLoCo: the members this one exchanges with in `round`, each of whom exchanges back;
    // none: a solo step. The gRPC link pairs (one at most); the in-process one forms the groups.
    virtual std::vector<uint64_t> partners(uint64_t round) = 0;
    // Every part at once with `partner`, each result in the order of `parts`. `bytes` is what the
    // parts carry together before zstd, for the link's time budget. tokens: said with each header.
    virtual std::vector<LinkExchanged> exchange(uint64_t round, uint64_t partner,
                                                std::vector<LinkPart> parts, uint64_t bytes,
                                                uint64_t tokens) = 0;
    // What the outer step of `round` made of `member`'s message: nullopt when it entered the
    // step, else why it was refused (a link that pairs may stop pairing with a member it refuses).
    virtual void judged(uint64_t member, uint64_t round,
                        const std::optional<std::string>& refusal) = 0;

    // DiLoCo: the members whose D the round averages, this one included, in node-id order.
    virtual std::vector<uint64_t> quorum(uint64_t round) = 0;
    // This member's message of `round`, for the others to gather; this also says the round.
    virtual void publish(uint64_t round, std::shared_ptr<const codec::EncodedMessage> message,
                         uint64_t tokens) = 0;
    // The message of each of `members` for `round`, members[i] into decoders[i]; adds the bytes
    // read to *bytes.
    virtual std::vector<LinkGathered> gather(uint64_t round, std::span<const uint64_t> members,
                                             std::span<codec::MessageDecoder* const> decoders,
                                             uint64_t* bytes) = 0;
};

}  // namespace starling
