#include "peer/round_deposits.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>

#include "peer/message_signature.h"
#include "peer/wire.h"

namespace starling {

namespace {

grpc::Status malformed(const std::string& why) {
    return {grpc::StatusCode::INVALID_ARGUMENT, "deposit refused: " + why};
}

}  // namespace

std::shared_ptr<RoundDeposits::Held> RoundDeposits::held_of(uint64_t author, bool create) {
    MutexLock lock(mutex_);
    if (stopped_) return nullptr;
    const auto it = held_.find(author);
    if (it != held_.end()) return it->second;
    if (!create) return nullptr;
    return held_.emplace(author, std::make_shared<Held>()).first->second;
}

grpc::Status RoundDeposits::accept(uint64_t author, const PublicKey& author_key, size_t anchored,
                                   grpc::ServerReader<v1::DepositRoundMessageFrame>& reader) {
    const std::shared_ptr<Held> held = held_of(author, true);
    if (!held) return {grpc::StatusCode::UNAVAILABLE, "this node is stopping"};
    const uint64_t share = limit_bytes_ / std::max<size_t>(1, anchored);
    auto message = std::make_shared<EncodedMessage>();
    std::optional<MessageDigest> digest;  // from the header of a round this node may hold on
    uint64_t round = 0, tokens = 0, bytes = 0, kept_bytes = 0;
    std::optional<Signature> signature;
    // A deposit of a round refused after its header leaves an empty message in its place, so that
    // fetches of it end at once with NOT_FOUND and turn to the author's other anchor rather than
    // wait here until their deadline.
    const auto refuse = [&](grpc::Status status) {
        if (digest) {
            record(*held, round, 0);
            held->board.publish(round, RoundMessage{});
        }
        return status;
    };
    v1::DepositRoundMessageFrame in;
    while (reader.Read(&in)) {
        const v1::RoundMessageFrame& frame = in.frame();
        if (signature) return refuse(malformed("a frame after the signature"));
        if (frame.has_header() == digest.has_value())
            return refuse(
                malformed(digest ? "a second header" : "a chunk or signature before the header"));
        if (frame.has_header()) {
            round = in.round();
            tokens = frame.tokens();
            MutexLock lock(mutex_);
            // The board keeps the newest two rounds: this one and the newest other held.
            for (const auto& [r, b] : held->bytes_by_round) {
                if (r > round)
                    return malformed("round " + std::to_string(round) + " is older than round " +
                                     std::to_string(r) + " held here");
                if (r != round) kept_bytes = b;
            }
            digest.emplace(author, round, 0, tokens);
        }
        if (frame.has_signature()) {
            if (!digest->verify(author_key, signature_view(frame.signature())))
                return refuse(malformed("its signature is not node " + format_node_id(author) +
                                        "'s of this message, round " + std::to_string(round) +
                                        " with " + std::to_string(tokens) + " tokens"));
            // verify() took only a signature of the right size.
            signature.emplace();
            std::memcpy(signature->data(), frame.signature().data(), signature->size());
            continue;
        }
        if (!frame.has_header() && !frame.has_chunk())
            return refuse(malformed("a frame with no body"));
        const std::string& piece = frame.has_header() ? frame.header() : frame.chunk();
        bytes += piece.size();
        if (kept_bytes + bytes > share)
            return refuse({grpc::StatusCode::RESOURCE_EXHAUSTED,
                           "deposit refused: node " + format_node_id(author) +
                               "'s messages here would pass its share of this node's relay " +
                               "limit ([peer].relay_limit_mib), " + std::to_string(share) +
                               " bytes"});
        digest->add(as_bytes(piece));
        const auto span = as_bytes(piece);
        auto& into = frame.has_header() ? message->header : message->chunks.emplace_back();
        into.assign(span.begin(), span.end());
    }
    if (!signature) return refuse(malformed("it ended before its signature"));
    record(*held, round, bytes);
    bytes_relayed_ += bytes;
    held->board.publish(round, {std::move(message), tokens, *signature});
    return grpc::Status::OK;
}

void RoundDeposits::record(Held& held, uint64_t round, uint64_t bytes) {
    MutexLock lock(mutex_);
    held.bytes_by_round[round] = bytes;
    while (held.bytes_by_round.size() > 2) held.bytes_by_round.erase(held.bytes_by_round.begin());
}

grpc::Status RoundDeposits::serve(uint64_t author, bool anchored_here, uint64_t round,
                                  SteadyClock::time_point deadline,
                                  grpc::ServerWriter<v1::RoundMessageFrame>& writer) {
    const std::shared_ptr<Held> held = held_of(author, anchored_here);
    if (!held)
        return {grpc::StatusCode::NOT_FOUND, "this node is not node " + format_node_id(author) +
                                                 "'s anchor and holds no message of it"};
    uint64_t served = 0;
    grpc::Status status = serve_round_message(held->board, round, deadline, writer, &served);
    bytes_relayed_ += served;
    return status;
}

void RoundDeposits::keep_only(const std::function<bool(uint64_t)>& anchored_here) {
    MutexLock lock(mutex_);
    std::erase_if(held_, [&](const auto& entry) { return !anchored_here(entry.first); });
}

void RoundDeposits::stop() {
    std::map<uint64_t, std::shared_ptr<Held>> held;
    {
        MutexLock lock(mutex_);
        stopped_ = true;
        held = held_;
    }
    for (auto& [author, h] : held) h->board.stop();
}

uint64_t RoundDeposits::bytes_held() const {
    MutexLock lock(mutex_);
    uint64_t total = 0;
    for (const auto& [author, h] : held_)
        for (const auto& [round, bytes] : h->bytes_by_round) total += bytes;
    return total;
}

std::string deposit_round_message(v1::Peer::Stub& stub, grpc::ClientContext& context,
                                  uint64_t round, const RoundMessage& message) {
    v1::DepositRoundMessageResponse response;
    const auto writer = stub.DepositRoundMessage(&context, &response);
    v1::DepositRoundMessageFrame out;
    out.set_round(round);
    out.mutable_frame()->set_header(as_field(message.message->header));
    out.mutable_frame()->set_tokens(message.tokens);
    bool open = writer->Write(out);
    out.clear_round();
    out.mutable_frame()->clear_tokens();
    for (size_t i = 0; open && i < message.message->chunks.size(); ++i) {
        out.mutable_frame()->set_chunk(as_field(message.message->chunks[i]));
        open = writer->Write(out);
    }
    if (open) {
        out.mutable_frame()->set_signature(signature_bytes(message.signature));
        open = writer->Write(out);
    }
    if (open) writer->WritesDone();
    const grpc::Status status = writer->Finish();
    if (status.ok()) return "";
    return std::string(status_code_name(status.error_code())) + ": " + status.error_message();
}

}  // namespace starling
