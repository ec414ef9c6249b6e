// One frame of Peer.Exchange as this node sends and receives it: v1::ExchangeFrame on the wire,
// byte for byte, but with the chunk body kept out of protobuf. A sent chunk goes from the buffer
// the encoder wrote straight to gRPC's transport, referenced rather than copied; a received one is
// copied once, out of gRPC's receive slices into a buffer reused frame after frame. Protobuf would
// copy each chunk twice more on each side, into a fresh string and a fresh slice, and the first
// touch of those fresh pages cost as much again: on loopback those copies took about as much CPU as
// TCP itself.
//
// Any gRPC client or server of peer.proto talks to this one: only the C++ types differ. The stream
// is opened and served with the calls gRPC's generated code itself makes
// (ClientReaderWriterFactory, BidiStreamingHandler), with this type in place of the protobuf one.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/impl/codegen/serialization_traits.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/sync_stream.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "starling/v1/peer.grpc.pb.h"

namespace starling {

using ChunkBuffer = std::shared_ptr<std::vector<std::byte>>;

struct ExchangeWireFrame {
    v1::ExchangeFrame fields;  // round, part and any body but a chunk
    bool has_chunk = false;    // the body is a chunk, in `chunk` (fields then has no body)
    ChunkBuffer chunk;         // kept between frames read into the same object, for reuse
};

// Buffers for outgoing chunks. gRPC may still hold a sent chunk after Write returns, so a buffer is
// reused only once nothing else refers to it; a stream needs two or three.
class ChunkBufferPool {
public:
    ChunkBuffer take();

private:
    std::vector<ChunkBuffer> buffers_;
};

using ExchangeClientStream = grpc::ClientReaderWriter<ExchangeWireFrame, ExchangeWireFrame>;
using ExchangeServerStream = grpc::ServerReaderWriter<ExchangeWireFrame, ExchangeWireFrame>;

// The methods of service Peer whose streams carry exchange frames: Exchange, to the partner, and
// RelayExchange, to the relay between two members that cannot be dialed.
enum class ExchangeMethod { Exchange, RelayExchange };

// Opens `method` on `channel` with wire frames as its messages.
std::unique_ptr<ExchangeClientStream> open_exchange_stream(
    const std::shared_ptr<grpc::Channel>& channel, grpc::ClientContext& context,
    ExchangeMethod method = ExchangeMethod::Exchange);

// Where `method` sits among the methods of service Peer, as the generated service numbers them.
int exchange_method_index(ExchangeMethod method);

}  // namespace starling

template <>
class grpc::SerializationTraits<starling::ExchangeWireFrame> {
public:
    static grpc::Status Serialize(const starling::ExchangeWireFrame& frame,
                                  grpc::ByteBuffer* buffer, bool* own_buffer);
    // Refuses (INTERNAL, naming the problem) a frame that is not a well-formed ExchangeFrame.
    static grpc::Status Deserialize(grpc::ByteBuffer* buffer, starling::ExchangeWireFrame* frame);
};
