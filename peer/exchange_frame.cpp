#include "peer/exchange_frame.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>

#include <cstring>
#include <string>

namespace starling {
namespace {

constexpr uint32_t kLengthDelimited = 2;
constexpr uint64_t kChunkTag =
    (uint64_t{v1::ExchangeFrame::kChunkFieldNumber} << 3) | kLengthDelimited;
const char* method_name(ExchangeMethod method) {
    return method == ExchangeMethod::Exchange ? "Exchange" : "RelayExchange";
}

void append_varint(std::string& out, uint64_t value) {
    uint8_t bytes[10];  // the longest varint
    const uint8_t* end =
        google::protobuf::io::CodedOutputStream::WriteVarint64ToArray(value, bytes);
    out.append(reinterpret_cast<const char*>(bytes), static_cast<size_t>(end - bytes));
}

// Reads a received message across gRPC's slices, which split it wherever the socket reads fell.
class SliceReader {
public:
    explicit SliceReader(const std::vector<grpc::Slice>& slices) : slices_(slices) {
        for (const grpc::Slice& slice : slices) remaining_ += slice.size();
    }

    size_t remaining() const { return remaining_; }

    bool read_varint(uint64_t& value) {
        value = 0;
        for (unsigned shift = 0; shift < 64; shift += 7) {
            std::byte b{};
            if (!copy(1, &b)) return false;
            value |= uint64_t(std::to_integer<uint8_t>(b) & 0x7f) << shift;
            if ((std::to_integer<uint8_t>(b) & 0x80) == 0) return true;
        }
        return false;  // more than ten bytes: not a varint
    }

    // Copies the next n bytes to out; false, copying nothing, when fewer remain.
    bool copy(size_t n, std::byte* out) {
        if (n > remaining_) return false;
        remaining_ -= n;
        while (n > 0) {
            const grpc::Slice& slice = slices_[index_];
            const size_t take = std::min(n, slice.size() - offset_);
            std::memcpy(out, slice.begin() + offset_, take);
            out += take;
            n -= take;
            offset_ += take;
            if (offset_ == slice.size()) {
                ++index_;
                offset_ = 0;
            }
        }
        return true;
    }

private:
    const std::vector<grpc::Slice>& slices_;
    size_t index_ = 0;
    size_t offset_ = 0;
    size_t remaining_ = 0;
};

grpc::Status malformed(const std::string& why) {
    return {grpc::StatusCode::INTERNAL, "malformed exchange frame: " + why};
}

// Appends one field other than the chunk, tag included, to `fields`.
grpc::Status copy_field(SliceReader& in, uint64_t tag, std::string& fields) {
    append_varint(fields, tag);
    const auto copy_bytes = [&](size_t n) {
        const size_t at = fields.size();
        fields.resize(at + n);
        return in.copy(n, reinterpret_cast<std::byte*>(fields.data() + at));
    };
    const uint64_t field = tag >> 3;
    switch (tag & 7) {
        case 0: {
            uint64_t value = 0;
            if (!in.read_varint(value))
                return malformed("field " + std::to_string(field) + " cut short");
            append_varint(fields, value);
            return grpc::Status::OK;
        }
        case 1:
            return copy_bytes(8) ? grpc::Status::OK
                                 : malformed("field " + std::to_string(field) + " cut short");
        case kLengthDelimited: {
            uint64_t length = 0;
            if (!in.read_varint(length) || length > in.remaining())
                return malformed("field " + std::to_string(field) + " is longer than the frame");
            append_varint(fields, length);
            copy_bytes(length);
            return grpc::Status::OK;
        }
        case 5:
            return copy_bytes(4) ? grpc::Status::OK
                                 : malformed("field " + std::to_string(field) + " cut short");
        default:
            return malformed("field " + std::to_string(field) + " has wire type " +
                             std::to_string(tag & 7));
    }
}

grpc::Status read_frame(SliceReader& in, starling::ExchangeWireFrame& frame) {
    std::string fields;
    frame.has_chunk = false;
    while (in.remaining() > 0) {
        uint64_t tag = 0;
        if (!in.read_varint(tag)) return malformed("a field tag cut short");
        if (tag != kChunkTag) {
            if (auto status = copy_field(in, tag, fields); !status.ok()) return status;
            continue;
        }
        uint64_t length = 0;
        if (!in.read_varint(length) || length > in.remaining())
            return malformed("a chunk longer than the frame (" + std::to_string(in.remaining()) +
                             " bytes left)");
        // The last frame's buffer is reused unless someone still holds it.
        if (!frame.chunk || frame.chunk.use_count() != 1)
            frame.chunk = std::make_shared<std::vector<std::byte>>();
        frame.chunk->resize(length);
        in.copy(length, frame.chunk->data());
        frame.has_chunk = true;
    }
    if (!frame.fields.ParseFromString(fields))
        return malformed("its fields do not parse as an ExchangeFrame");
    if (frame.has_chunk && frame.fields.body_case() != v1::ExchangeFrame::BODY_NOT_SET)
        return malformed("a chunk and another body in one frame");
    return grpc::Status::OK;
}

void release_chunk(void* holder) { delete static_cast<ChunkBuffer*>(holder); }

}  // namespace

ChunkBuffer ChunkBufferPool::take() {
    for (const ChunkBuffer& buffer : buffers_)
        if (buffer.use_count() == 1) return buffer;
    return buffers_.emplace_back(std::make_shared<std::vector<std::byte>>());
}

std::unique_ptr<ExchangeClientStream> open_exchange_stream(
    const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context,
    ExchangeMethod method) {
    // gRPC keeps the path's pointer for the call's life: a string with static storage.
    static const auto path_of = [](ExchangeMethod m) {
        return "/" + std::string(v1::Peer::service_full_name()) + "/" + method_name(m);
    };
    static const std::string paths[] = {path_of(ExchangeMethod::Exchange),
                                        path_of(ExchangeMethod::RelayExchange)};
    const grpc::internal::RpcMethod rpc(paths[method == ExchangeMethod::Exchange ? 0 : 1].c_str(),
                                        grpc::internal::RpcMethod::BIDI_STREAMING, channel);
    return std::unique_ptr<ExchangeClientStream>(
        grpc::internal::ClientReaderWriterFactory<ExchangeWireFrame, ExchangeWireFrame>::Create(
            channel.get(), rpc, &context));
}

int exchange_method_index(ExchangeMethod method) {
    const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
        v1::Peer::service_full_name());
    return service->FindMethodByName(method_name(method))->index();
}

}  // namespace starling

grpc::Status grpc::SerializationTraits<starling::ExchangeWireFrame>::Serialize(
    const starling::ExchangeWireFrame& frame, grpc::ByteBuffer* buffer, bool* own_buffer) {
    using starling::v1::ExchangeFrame;
    *own_buffer = true;
    std::string head = frame.fields.SerializeAsString();
    if (!frame.has_chunk) {
        grpc::Slice slice(head);
        grpc::ByteBuffer serialized(&slice, 1);
        buffer->Swap(&serialized);
        return grpc::Status::OK;
    }
    if (frame.fields.body_case() != ExchangeFrame::BODY_NOT_SET)
        return {grpc::StatusCode::INTERNAL, "an exchange frame with a chunk and another body"};
    starling::append_varint(head, starling::kChunkTag);
    starling::append_varint(head, frame.chunk->size());
    // The slice holds a reference to the chunk's buffer until gRPC has sent it.
    grpc::Slice slices[2] = {
        grpc::Slice(head),
        grpc::Slice(frame.chunk->data(), frame.chunk->size(), starling::release_chunk,
                    new starling::ChunkBuffer(frame.chunk))};
    grpc::ByteBuffer serialized(slices, frame.chunk->empty() ? 1 : 2);
    buffer->Swap(&serialized);
    return grpc::Status::OK;
}

grpc::Status grpc::SerializationTraits<starling::ExchangeWireFrame>::Deserialize(
    grpc::ByteBuffer* buffer, starling::ExchangeWireFrame* frame) {
    if (buffer == nullptr) return {grpc::StatusCode::INTERNAL, "no payload"};
    std::vector<grpc::Slice> slices;
    grpc::Status status = buffer->Dump(&slices);
    if (status.ok()) {
        starling::SliceReader in(slices);
        status = starling::read_frame(in, *frame);
    }
    buffer->Clear();
    return status;
}
