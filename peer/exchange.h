// The exchange of one round between two paired nodes: one gRPC bidirectional stream (Peer.Exchange)
// carrying both encoded messages at once, chunk by chunk, each side writing its own on a thread
// while it reads and decodes the other's straight into the destination arena. A side holds at most
// the chunk it is writing and the one it is decoding, never a whole message.
//
// Each direction carries its sender's message (header, then chunks, then the sender's signature of
// it: peer/message_signature.h) and one receipt for the message going the other way: "complete"
// once the whole message decoded and its signature verified, or what was wrong. A receiver that
// finds the incoming message corrupt says so in its receipt at once (the sender stops sending it)
// and keeps sending its own, so one bad direction does not cost the other. The server also answers
// the stream with INVALID_ARGUMENT naming the problem.
//
// The node with the lower id opens the stream (open_exchange); the other posts its slot on its
// ExchangeBoard and the stream's handler takes it from there (ExchangeBoard::serve). Both sides are
// bounded by the slot's deadline; a stream that breaks (a killed partner) ends them at once.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "codec/message.h"
#include "common/mutex.h"
#include "peer/exchange_frame.h"
#include "peer/identity.h"
#include "peer/membership.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {

// The largest frame on the wire: one chunk with its header, and room for the frame's own fields.
inline constexpr size_t kMaxExchangeFrameBytes = codec::kMaxChunkBytes + (64u << 10);

// Our message, frame by frame: the header, then chunks until next_chunk returns false. next_chunk
// gets a free buffer and either fills it or points it at a buffer of its own holding the chunk
// (already encoded messages go out without a copy). It may throw starling::Error (an encoder
// refusing a NaN): the message is then aborted.
struct OutgoingMessage {
    std::vector<std::byte> header;
    std::function<bool(ChunkBuffer&)> next_chunk;
};

// An encoder's message; the encoder must outlive the exchange.
OutgoingMessage outgoing_message(codec::MessageEncoder& encoder);

// What one side brings to the exchange of a round.
struct ExchangeSlot {
    uint64_t round = 0;
    uint64_t partner = 0;  // node id, as paired for the round
    OutgoingMessage outgoing;
    codec::MessageDecoder& incoming;  // decodes the partner's message into its destination arena
    // Ends the exchange earlier than exchange_timeout from its start: a round that sends two
    // messages (split mode) keeps both within one T_xchg.
    std::optional<SteadyClock::time_point> deadline;
    // Which of the round's messages this is (split mode sends D as part 0 and phi as part 1, each
    // on a stream of its own, at the same time); both sides use the same numbers.
    uint32_t part = 0;
    uint64_t tokens = 0;  // trained on in the round the message ends, said with its header
    // Set by the node (RoundPeers::exchange): this node's identity, which signs the outgoing
    // message, and the partner's public key, under which the incoming one must verify.
    const NodeIdentity* author = nullptr;
    PublicKey partner_key{};
};

struct ExchangeResult {
    bool delivered = false;       // the partner received our whole message and decoded it
    bool received = false;        // the partner's whole message arrived and decoded into the arena
    uint64_t bytes_sent = 0;      // header and chunk bytes written to the stream
    uint64_t bytes_received = 0;  // header and chunk bytes read from it
    std::string error;            // what went wrong, when either of the two is false
    bool refused = false;  // this node refused the partner's message (malformed or mismatched)
    uint64_t partner_tokens = 0;  // what the partner said it trained on; 0: nothing said
    // When the partner's message header arrived: the transfer ran from then on, both sides there.
    std::optional<SteadyClock::time_point> partner_header_at;
};

// How long an exchange of `bytes` (both messages of a round, if two share the link) may take: four
// times what the rate measured with this partner (or, before one, min_bytes_per_s) needs, within
// [floor, ceiling]. A slow link gets the time its transfer needs; a fast one keeps the floor.
std::chrono::milliseconds exchange_budget(uint64_t bytes,
                                          std::optional<double> measured_bytes_per_s,
                                          double min_bytes_per_s, std::chrono::milliseconds floor,
                                          std::chrono::milliseconds ceiling);

// A result that failed before any byte moved.
ExchangeResult exchange_failed(std::string error);

// The opening side: runs the exchange on a stream over `channel`, to the partner or, between two
// members that cannot be dialed, to the relay both stream to. The context carries the deadline and
// the caller's authentication (and, to a relay, the partner it is for).
ExchangeResult open_exchange(const std::shared_ptr<grpc::Channel>& channel,
                             grpc::ClientContext& context, ExchangeSlot& slot,
                             ExchangeMethod method = ExchangeMethod::Exchange);

// Slots this node has posted for the partner to stream into, and the client streams it has open,
// so that stop() can end them all at once.
class ExchangeBoard {
public:
    // Posts slot and waits until the partner's stream has used it; gives up when no stream takes it
    // before the deadline, when partner_gone() says the partner left or died, or on stop().
    ExchangeResult serve(ExchangeSlot& slot, SteadyClock::time_point deadline,
                         const std::function<bool()>& partner_gone);

    // The handler's side of Peer.Exchange: waits (until `limit`) for the slot of the first
    // frame's round and part, checks the caller is that slot's partner, and runs the exchange until
    // the slot's deadline. The returned status is the stream's.
    grpc::Status answer(grpc::ServerContext& context, ExchangeServerStream& stream, uint64_t caller,
                        const ExchangeWireFrame& first, SteadyClock::time_point limit);

    // Client streams in flight; false (not tracked) once stopped.
    bool track(grpc::ClientContext& context);
    void untrack(grpc::ClientContext& context);

    // Cancels every open client stream and wakes every wait; later calls fail at once.
    void stop();

private:
    struct Posting {
        ExchangeSlot* slot = nullptr;
        SteadyClock::time_point deadline{};
        bool claimed = false;  // a stream has it
        bool done = false;
        ExchangeResult result;
    };

    Mutex mutex_;
    std::condition_variable changed_;
    // By round and part.
    std::map<std::pair<uint64_t, uint32_t>, Posting> posted_ ABSL_GUARDED_BY(mutex_);
    std::set<grpc::ClientContext*> clients_ ABSL_GUARDED_BY(mutex_);
    bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace starling
