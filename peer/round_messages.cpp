#include "peer/round_messages.h"

#include <optional>

#include "common/error.h"
#include "peer/identity.h"
#include "peer/message_signature.h"
#include "peer/wire.h"

namespace starling {

Signature sign_round_message(const NodeIdentity& author, uint64_t round,
                             const EncodedMessage& message, uint64_t tokens) {
    MessageDigest digest(author.node_id(), round, 0, tokens);
    digest.add(message.header);
    for (const auto& chunk : message.chunks) digest.add(chunk);
    return digest.sign(author);
}

void RoundMessageBoard::publish(uint64_t round, RoundMessage message) {
    {
        MutexLock lock(mutex_);
        messages_[round] = std::move(message);
        while (messages_.size() > 2) messages_.erase(messages_.begin());
    }
    published_.notify_all();
}

RoundMessage RoundMessageBoard::wait(uint64_t round, SteadyClock::time_point deadline,
                                     uint64_t* newest_held) {
    MutexLock lock(mutex_);
    lock.wait_until(published_, deadline, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return stopped_ || messages_.contains(round) ||
               (!messages_.empty() && messages_.rbegin()->first > round);
    });
    if (newest_held) *newest_held = messages_.empty() ? 0 : messages_.rbegin()->first;
    const auto it = messages_.find(round);
    return stopped_ || it == messages_.end() ? RoundMessage{} : it->second;
}

void RoundMessageBoard::stop() {
    {
        MutexLock lock(mutex_);
        stopped_ = true;
    }
    published_.notify_all();
}

grpc::Status serve_round_message(RoundMessageBoard& board, uint64_t round,
                                 SteadyClock::time_point deadline,
                                 grpc::ServerWriter<v1::RoundMessageFrame>& writer,
                                 uint64_t* served) {
    uint64_t newest_held = 0;
    const RoundMessage published = board.wait(round, deadline, &newest_held);
    if (!published.message && newest_held > round)
        return {grpc::StatusCode::NOT_FOUND, "no message for round " + std::to_string(round) +
                                                 " here any more: round " +
                                                 std::to_string(newest_held) + " is the newest"};
    if (!published.message)
        return {grpc::StatusCode::NOT_FOUND,
                "no message for round " + std::to_string(round) + " here"};
    v1::RoundMessageFrame frame;
    frame.set_header(as_field(published.message->header));
    frame.set_tokens(published.tokens);
    if (!writer.Write(frame)) return {grpc::StatusCode::CANCELLED, "the caller went away"};
    if (served) *served += published.message->header.size();
    frame.clear_tokens();
    for (const auto& chunk : published.message->chunks) {
        frame.set_chunk(as_field(chunk));
        if (!writer.Write(frame)) return {grpc::StatusCode::CANCELLED, "the caller went away"};
        if (served) *served += chunk.size();
    }
    frame.set_signature(signature_bytes(published.signature));
    if (!writer.Write(frame)) return {grpc::StatusCode::CANCELLED, "the caller went away"};
    return grpc::Status::OK;
}

FetchedRoundMessage fetch_round_message(v1::Peer::Stub& stub, grpc::ClientContext& context,
                                        uint64_t round, uint64_t sender,
                                        const PublicKey& sender_key, codec::MessageDecoder& decoder,
                                        uint64_t* bytes) {
    v1::FetchRoundMessageRequest request;
    request.set_round(round);
    request.set_author(sender);
    const auto reader = stub.FetchRoundMessage(&context, request);
    v1::RoundMessageFrame frame;
    std::string problem;
    uint64_t tokens = 0;
    std::optional<MessageDigest> digest;  // from the header on
    bool signed_by_sender = false;
    while (problem.empty() && reader->Read(&frame)) {
        try {
            if (signed_by_sender) throw Error("a frame after the signature");
            if (frame.has_header() != !decoder.has_header())
                throw Error(decoder.has_header() ? "a second header"
                                                 : "a chunk or signature before the header");
            if (frame.has_header()) {
                *bytes += frame.header().size();
                tokens = frame.tokens();
                decoder.accept_header(as_bytes(frame.header()));
                const codec::MessageHeader& h = decoder.header();
                if (h.node_id != sender || h.round != round)
                    throw Error("the message is node " + format_node_id(h.node_id) +
                                "'s for round " + std::to_string(h.round));
                digest.emplace(sender, round, 0, tokens);
                digest->add(as_bytes(frame.header()));
            } else if (frame.has_chunk()) {
                *bytes += frame.chunk().size();
                decoder.accept_chunk(as_bytes(frame.chunk()));
                digest->add(as_bytes(frame.chunk()));
            } else if (frame.has_signature()) {
                if (!decoder.complete()) throw Error("a signature before the message's last chunk");
                if (!digest->verify(sender_key, signature_view(frame.signature())))
                    throw Error("its signature is not node " + format_node_id(sender) +
                                "'s of this message, round " + std::to_string(round) + " with " +
                                std::to_string(tokens) + " tokens");
                signed_by_sender = true;
            } else {
                throw Error("a frame with no body");
            }
        } catch (const Error& e) {
            problem = e.what();
            context.TryCancel();
        }
    }
    const grpc::Status status = reader->Finish();
    if (!problem.empty()) return {problem, true};
    if (!status.ok())
        return {std::string("stream status ") + status_code_name(status.error_code()) + ": " +
                    status.error_message(),
                false, status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED,
                status.error_code() == grpc::StatusCode::UNAVAILABLE && !decoder.has_header(),
                status.error_code() == grpc::StatusCode::NOT_FOUND && !decoder.has_header()};
    if (!decoder.complete()) return {"the message ended before its last chunk"};
    if (!signed_by_sender) return {"the message ended before its signature", true};
    FetchedRoundMessage fetched;
    fetched.tokens = tokens;
    return fetched;
}

}  // namespace starling
