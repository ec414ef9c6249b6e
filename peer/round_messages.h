// DiLoCo's all-gather without a coordinator: every member encodes its round's message once and
// publishes it on its RoundMessageBoard; every other member pulls it with Peer.FetchRoundMessage
// and decodes it straight into an arena. A member whose message does not arrive by the deadline
// is left out of the round's mean, so members that saw the same messages land on the same bits.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "codec/message.h"
#include "common/mutex.h"
#include "peer/identity.h"
#include "peer/membership.h"
#include "starling/v1/peer.grpc.pb.h"

namespace starling {

using codec::EncodedMessage;

// A round's message as published, with the tokens its sender trained on in the round (0: not
// said), which weigh the members' mean, and its author's signature of both
// (peer/message_signature.h), served after the last chunk.
struct RoundMessage {
    std::shared_ptr<const EncodedMessage> message;
    uint64_t tokens = 0;
    Signature signature{};
};

// `author`'s signature of its message of `round` claiming `tokens`.
Signature sign_round_message(const NodeIdentity& author, uint64_t round,
                             const EncodedMessage& message, uint64_t tokens);

// This node's messages of the last two rounds, for members to fetch.
class RoundMessageBoard {
public:
    void publish(uint64_t round, RoundMessage message);
    // The round's message once published; an empty one when the deadline passes first, when the
    // round is older than the ones kept, or after stop(). Sets *newest_held, when given, to the
    // newest round kept (0: none).
    RoundMessage wait(uint64_t round, SteadyClock::time_point deadline,
                      uint64_t* newest_held = nullptr);
    void stop();

private:
    Mutex mutex_;
    std::condition_variable published_;
    std::map<uint64_t, RoundMessage> messages_ ABSL_GUARDED_BY(mutex_);  // by round, the last two
    bool stopped_ ABSL_GUARDED_BY(mutex_) = false;
};

// The server's side of Peer.FetchRoundMessage: the message, frame by frame. Adds the message bytes
// written to *served when given.
grpc::Status serve_round_message(RoundMessageBoard& board, uint64_t round,
                                 SteadyClock::time_point deadline,
                                 grpc::ServerWriter<v1::RoundMessageFrame>& writer,
                                 uint64_t* served = nullptr);

struct FetchedRoundMessage {
    std::string error;         // "" when the message arrived whole, else what went wrong
    bool refused = false;      // it came malformed, or as another sender's or round's
    bool timed_out = false;    // the call's deadline cut it off
    bool unreachable = false;  // UNAVAILABLE before any frame: the call never reached the member
    bool absent = false;       // NOT_FOUND before any frame: the member called has no such message
    uint64_t tokens = 0;       // what the sender said it trained on (0: nothing said)
};

// The caller's side: fetches `sender`'s message for `round` into `decoder` from the member `stub`
// calls (the sender, or one of its anchors: peer/round_deposits.h), checking that it names that
// sender and round and that its signature verifies under `sender_key`; adds the bytes read to
// *bytes.
FetchedRoundMessage fetch_round_message(v1::Peer::Stub& stub, grpc::ClientContext& context,
                                        uint64_t round, uint64_t sender,
                                        const PublicKey& sender_key, codec::MessageDecoder& decoder,
                                        uint64_t* bytes);

}  // namespace starling
