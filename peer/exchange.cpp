#include "peer/exchange.h"

#include <atomic>
#include <algorithm>
#include <optional>
#include <span>
#include <thread>

#include "common/error.h"
#include "peer/message_signature.h"
#include "peer/wire.h"

namespace starling {
namespace {

// How often a posted slot nobody has taken yet checks whether its partner is still there.
constexpr auto kPartnerCheck = std::chrono::milliseconds(50);

std::span<const std::byte> bytes_of(const std::string& text) {
    return {reinterpret_cast<const std::byte*>(text.data()), text.size()};
}

// Cancels a server stream at a deadline of this node's own, whatever deadline the caller set.
class CancelAt {
public:
    CancelAt(grpc::ServerContext& context, SteadyClock::time_point deadline)
        : thread_([this, &context, deadline] {
              MutexLock lock(mutex_);
              if (!lock.wait_until(disarmed_changed_, deadline,
                                   [&]()
                                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return disarmed_; }))
                  context.TryCancel();
          }) {}
    ~CancelAt() {
        {
            MutexLock lock(mutex_);
            disarmed_ = true;
        }
        disarmed_changed_.notify_all();
        thread_.join();
    }
    CancelAt(const CancelAt&) = delete;
    CancelAt& operator=(const CancelAt&) = delete;

private:
    Mutex mutex_;
    std::condition_variable disarmed_changed_;
    bool disarmed_ ABSL_GUARDED_BY(mutex_) = false;
    std::thread thread_;  // last: starts once the members above exist
};

// One side of an exchange stream. A writer thread sends our message and then our receipt; the
// calling thread reads the partner's frames and decodes its message. They share only the receipt
// (reader to writer) and whether the partner refused our message (so the writer stops early).
class Duplex {
public:
    explicit Duplex(ExchangeSlot& slot) : slot_(slot) {}

    // Stream: a ClientReaderWriter or a ServerReaderWriter; one writer at a time is all gRPC
    // allows, and this is the only one.
    template <typename Stream>
    void write(Stream& stream) {
        const codec::SerialCoding serial;
        ExchangeWireFrame frame;
        frame.fields.set_round(slot_.round);
        frame.fields.set_part(slot_.part);
        frame.fields.set_header(slot_.outgoing.header.data(), slot_.outgoing.header.size());
        frame.fields.set_tokens(slot_.tokens);
        MessageDigest digest(slot_.author->node_id(), slot_.round, slot_.part, slot_.tokens);
        digest.add(bytes_of(frame.fields.header()));
        if (!send(stream, frame)) return;
        frame.fields.clear_tokens();
        ChunkBufferPool buffers;
        while (!partner_refused_) {
            if (!send_receipt_if_settled(stream, frame)) return;
            frame.chunk.reset();  // the last chunk's buffer is free again once gRPC has sent it
            ChunkBuffer chunk = buffers.take();
            bool more = false;
            try {
                more = slot_.outgoing.next_chunk(chunk);
            } catch (const std::exception& e) {
                outgoing_error_ = std::string("could not be encoded: ") + e.what();
                frame.has_chunk = false;
                frame.fields.set_abort(outgoing_error_);
                if (!send(stream, frame)) return;
                break;
            }
            if (!more) {
                frame.has_chunk = false;
                frame.fields.set_signature(signature_bytes(digest.sign(*slot_.author)));
                if (!send(stream, frame)) return;
                break;
            }
            frame.fields.clear_body();
            digest.add(*chunk);
            frame.chunk = std::move(chunk);
            frame.has_chunk = true;
            if (!send(stream, frame)) return;
        }
        // The reading side settles the receipt at the latest when the stream ends, so this wait
        // is bounded by the stream's deadline.
        {
            MutexLock lock(mutex_);
            lock.wait(settled_changed_,
                      [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return receipt_.has_value(); });
        }
        send_receipt_if_settled(stream, frame);
    }

    // One incoming frame, on the reading thread.
    void read(const ExchangeWireFrame& wire) {
        const v1::ExchangeFrame& frame = wire.fields;
        if (frame.round() != slot_.round || frame.part() != slot_.part)
            return refuse(Failure::Corrupt,
                          "a frame for round " + std::to_string(frame.round()) + " part " +
                              std::to_string(frame.part()) + " in the exchange of round " +
                              std::to_string(slot_.round) + " part " + std::to_string(slot_.part));
        if (wire.has_chunk) {
            bytes_received_ += wire.chunk->size();
            return decode([&] {
                slot_.incoming.accept_chunk(*wire.chunk);
                digest_->add(*wire.chunk);
                ++chunks_received_;
            });
        }
        switch (frame.body_case()) {
            case v1::ExchangeFrame::kHeader:
                bytes_received_ += frame.header().size();
                header_at_ = SteadyClock::now();
                partner_tokens_ = frame.tokens();
                return decode([&] {
                    slot_.incoming.accept_header(bytes_of(frame.header()));
                    check_sender(slot_.incoming.header());
                    digest_.emplace(slot_.partner, slot_.round, slot_.part, frame.tokens());
                    digest_->add(bytes_of(frame.header()));
                });
            case v1::ExchangeFrame::kSignature:
                if (settled()) return;
                if (!slot_.incoming.has_header())
                    return refuse(Failure::Corrupt, "a signature before the message header");
                if (!slot_.incoming.complete())
                    return refuse(Failure::Corrupt,
                                  "the signature came after " + std::to_string(chunks_received_) +
                                      " of " + std::to_string(slot_.incoming.header().chunk_count) +
                                      " chunks");
                if (!digest_->verify(slot_.partner_key, signature_view(frame.signature())))
                    return refuse(Failure::Corrupt,
                                  "its signature is not node " + format_node_id(slot_.partner) +
                                      "'s of this message, round " + std::to_string(slot_.round) +
                                      " part " + std::to_string(slot_.part) + " with " +
                                      std::to_string(partner_tokens_) + " tokens");
                return settle(Failure::None, "");
            case v1::ExchangeFrame::kAbort:
                return refuse(Failure::Aborted,
                              "the partner aborted its message: " + frame.abort());
            case v1::ExchangeFrame::kReceipt:
                if (!their_receipt_) {
                    their_receipt_ = frame.receipt();
                    partner_refused_ = !frame.receipt().complete();
                }
                return;
            default: return refuse(Failure::Corrupt, "a frame with no body");
        }
    }

    // The partner's frames stopped coming: a message still incomplete is cut off.
    void reading_ended() {
        if (settled()) return;
        if (!slot_.incoming.has_header())
            return refuse(Failure::Cut, "the stream ended before the message header");
        if (slot_.incoming.complete())
            return refuse(Failure::Cut, "the stream ended before the message's signature");
        refuse(Failure::Cut, "the stream ended after " + std::to_string(chunks_received_) + " of " +
                                 std::to_string(slot_.incoming.header().chunk_count) + " chunks");
    }

    ExchangeResult result(const std::string& transport_error) const {
        ExchangeResult result;
        result.received = failure_ == Failure::None && slot_.incoming.complete();
        result.delivered = their_receipt_ && their_receipt_->complete();
        result.refused = failure_ == Failure::Corrupt;
        result.bytes_sent = bytes_sent_;
        result.bytes_received = bytes_received_;
        result.partner_tokens = partner_tokens_;
        result.partner_header_at = header_at_;
        std::vector<std::string> problems;
        if (!result.received) problems.push_back("their message: " + incoming_error_);
        if (!result.delivered) {
            problems.push_back("our message: " +
                               (!outgoing_error_.empty() ? outgoing_error_
                                : their_receipt_
                                    ? "refused by the partner: " + their_receipt_->error()
                                    : std::string("no receipt from the partner")));
        }
        if (!transport_error.empty()) problems.push_back(transport_error);
        for (const auto& problem : problems)
            result.error += (result.error.empty() ? "" : "; ") + problem;
        return result;
    }

    // What the server answers the stream with: about the caller's message.
    grpc::Status status() const {
        switch (failure_) {
            case Failure::None: return grpc::Status::OK;
            case Failure::Aborted: return {grpc::StatusCode::ABORTED, incoming_error_};
            case Failure::Corrupt:
            case Failure::Cut: return {grpc::StatusCode::INVALID_ARGUMENT, incoming_error_};
        }
        return grpc::Status::OK;
    }

    const v1::ExchangeReceipt* their_receipt() const {
        return their_receipt_ ? &*their_receipt_ : nullptr;
    }

private:
    enum class Failure { None, Corrupt, Aborted, Cut };

    template <typename Stream>
    bool send(Stream& stream, const ExchangeWireFrame& frame) {
        if (!stream.Write(frame)) return false;
        bytes_sent_ += frame.fields.header().size() + (frame.has_chunk ? frame.chunk->size() : 0);
        return true;
    }

    template <typename Stream>
    bool send_receipt_if_settled(Stream& stream, ExchangeWireFrame& frame) {
        std::optional<v1::ExchangeReceipt> receipt;
        {
            MutexLock lock(mutex_);
            if (!receipt_ || receipt_sent_) return true;
            receipt = receipt_;
            receipt_sent_ = true;
        }
        frame.has_chunk = false;
        *frame.fields.mutable_receipt() = *receipt;
        return stream.Write(frame);
    }

    // A whole message settles only with its signature (read()).
    template <typename Decode>
    void decode(Decode&& step) {
        // Once settled, the rest of a message is dropped: the receipt has gone out.
        if (settled()) return;
        try {
            step();
        } catch (const Error& e) {
            return refuse(Failure::Corrupt, e.what());
        }
    }

    void check_sender(const codec::MessageHeader& header) const {
        if (header.node_id != slot_.partner)
            throw Error("message header names node " + format_node_id(header.node_id) +
                        " as its sender, not the partner " + format_node_id(slot_.partner));
        if (header.round != slot_.round)
            throw Error("message header is for round " + std::to_string(header.round) +
                        ", the exchange for round " + std::to_string(slot_.round));
    }

    void refuse(Failure failure, std::string why) {
        if (!settled()) settle(failure, std::move(why));
    }

    bool settled() const {
        MutexLock lock(mutex_);
        return receipt_.has_value();
    }

    void settle(Failure failure, std::string why) {
        failure_ = failure;
        incoming_error_ = why;
        {
            MutexLock lock(mutex_);
            receipt_.emplace();
            receipt_->set_complete(failure == Failure::None);
            receipt_->set_error(std::move(why));
        }
        settled_changed_.notify_all();
    }

    ExchangeSlot& slot_;
    // Writer thread's.
    uint64_t bytes_sent_ = 0;
    std::string outgoing_error_;
    // Reading thread's.
    uint64_t bytes_received_ = 0;
    std::optional<SteadyClock::time_point> header_at_;
    uint64_t partner_tokens_ = 0;
    uint32_t chunks_received_ = 0;
    std::optional<MessageDigest> digest_;  // from the header on
    Failure failure_ = Failure::None;
    std::string incoming_error_;
    std::optional<v1::ExchangeReceipt> their_receipt_;
    // Shared.
    std::atomic<bool> partner_refused_{false};
    mutable Mutex mutex_;
    std::condition_variable settled_changed_;
    // Ours, once the partner's message is settled.
    std::optional<v1::ExchangeReceipt> receipt_ ABSL_GUARDED_BY(mutex_);
    bool receipt_sent_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace

OutgoingMessage outgoing_message(codec::MessageEncoder& encoder) {
    return {encoder.header_bytes(),
            [&encoder](ChunkBuffer& out) { return encoder.next_chunk(*out); }};
}

std::chrono::milliseconds exchange_budget(uint64_t bytes,
                                          std::optional<double> measured_bytes_per_s,
                                          double min_bytes_per_s, std::chrono::milliseconds floor,
                                          std::chrono::milliseconds ceiling) {
    const double rate = std::max(measured_bytes_per_s.value_or(min_bytes_per_s), 1.0);
    const double seconds = std::min(4.0 * static_cast<double>(bytes) / rate, 1e7);
    const auto wanted = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
    return std::clamp(wanted, floor, std::max(floor, ceiling));
}

ExchangeResult exchange_failed(std::string error) {
    ExchangeResult result;
    result.error = std::move(error);
    return result;
}

ExchangeResult open_exchange(const std::shared_ptr<grpc::Channel>& channel,
                             grpc::ClientContext& context, ExchangeSlot& slot,
                             ExchangeMethod method) {
    const auto stream = open_exchange_stream(channel, context, method);
    Duplex duplex(slot);
    std::thread writer([&] {
        duplex.write(*stream);
        stream->WritesDone();
    });
    {
        const codec::SerialCoding serial;
        ExchangeWireFrame frame;
        while (stream->Read(&frame)) duplex.read(frame);
    }
    duplex.reading_ended();
    writer.join();
    const grpc::Status status = stream->Finish();
    if (status.ok()) return duplex.result("");
    // A refusal the receipt already named needs only its code here.
    const auto* receipt = duplex.their_receipt();
    const bool named = receipt && receipt->error() == status.error_message();
    return duplex.result(std::string("stream status ") + status_code_name(status.error_code()) +
                         (named ? "" : ": " + status.error_message()));
}

ExchangeResult ExchangeBoard::serve(ExchangeSlot& slot, SteadyClock::time_point deadline,
                                    const std::function<bool()>& partner_gone) {
    MutexLock lock(mutex_);
    if (stopped_) return exchange_failed("this node is stopping");
    const std::pair key{slot.round, slot.part};
    const auto [it, posted] = posted_.try_emplace(key);
    if (!posted)
        return exchange_failed("an exchange for round " + std::to_string(slot.round) + " part " +
                               std::to_string(slot.part) + " is already posted");
    Posting& posting = it->second;
    posting.slot = &slot;
    posting.deadline = deadline;
    changed_.notify_all();
    while (!posting.done) {
        if (posting.claimed) {
            // The stream's handler ends by the slot's deadline (CancelAt) or at shutdown.
            lock.wait(changed_);
            continue;
        }
        std::string why;
        if (stopped_)
            why = "this node is stopping";
        else if (SteadyClock::now() >= deadline)
            why = "the partner did not open the exchange before the deadline";
        else if (partner_gone())
            why = "the partner left or died";
        if (!why.empty()) {
            posted_.erase(key);
            return exchange_failed(why);
        }
        lock.wait_until(changed_, std::min(deadline, SteadyClock::now() + kPartnerCheck));
    }
    ExchangeResult result = std::move(posting.result);
    posted_.erase(key);
    return result;
}

grpc::Status ExchangeBoard::answer(grpc::ServerContext& context, ExchangeServerStream& stream,
                                   uint64_t caller, const ExchangeWireFrame& first,
                                   SteadyClock::time_point limit) {
    const uint64_t round = first.fields.round();
    const std::pair key{round, first.fields.part()};
    Posting* posting = nullptr;
    {
        MutexLock lock(mutex_);
        lock.wait_until(changed_, limit, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
            return stopped_ || posted_.contains(key);
        });
        if (stopped_) return {grpc::StatusCode::UNAVAILABLE, "this node is stopping"};
        const auto it = posted_.find(key);
        if (it == posted_.end())
            return {grpc::StatusCode::DEADLINE_EXCEEDED, "this node posted no exchange for round " +
                                                             std::to_string(round) + " part " +
                                                             std::to_string(first.fields.part())};
        if (it->second.slot->partner != caller)
            return {grpc::StatusCode::PERMISSION_DENIED,
                    "node " + format_node_id(caller) + " is not this node's partner for round " +
                        std::to_string(round)};
        if (it->second.claimed)
            return {grpc::StatusCode::ALREADY_EXISTS,
                    "the exchange of round " + std::to_string(round) + " is already open"};
        posting = &it->second;
        posting->claimed = true;
    }
    Duplex duplex(*posting->slot);
    {
        CancelAt watchdog(context, posting->deadline);
        std::thread writer([&] { duplex.write(stream); });
        const codec::SerialCoding serial;
        duplex.read(first);
        ExchangeWireFrame frame;
        while (stream.Read(&frame)) duplex.read(frame);
        duplex.reading_ended();
        writer.join();
    }
    const bool cancelled = context.IsCancelled();
    ExchangeResult result = duplex.result(
        cancelled ? "the stream was cancelled (deadline, shutdown or the partner gone)" : "");
    {
        MutexLock lock(mutex_);
        posting->result = std::move(result);
        posting->done = true;
    }
    changed_.notify_all();
    return cancelled ? grpc::Status(grpc::StatusCode::CANCELLED, "exchange cancelled")
                     : duplex.status();
}

bool ExchangeBoard::track(grpc::ClientContext& context) {
    MutexLock lock(mutex_);
    if (stopped_) return false;
    clients_.insert(&context);
    return true;
}

void ExchangeBoard::untrack(grpc::ClientContext& context) {
    MutexLock lock(mutex_);
    clients_.erase(&context);
}

void ExchangeBoard::stop() {
    MutexLock lock(mutex_);
    stopped_ = true;
    for (grpc::ClientContext* context : clients_) context->TryCancel();
    changed_.notify_all();
}

}  // namespace starling
