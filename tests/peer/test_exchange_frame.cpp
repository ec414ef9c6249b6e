// Exchange wire frames against protobuf's own ExchangeFrame, the independent reference: what one
// writes the other reads, whichever way, however gRPC splits the bytes into slices; and frames no
// member would send are refused with a status naming the problem.
#include <catch2/catch.hpp>
#include <google/protobuf/descriptor.h>
#include <grpcpp/grpcpp.h>

#include <random>
#include <string>
#include <vector>

#include "peer/exchange_frame.h"

using namespace starling;
using Traits = grpc::SerializationTraits<ExchangeWireFrame>;

namespace {

std::vector<std::byte> random_bytes(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::byte> bytes(n);
    for (auto& b : bytes) b = std::byte(rng() & 0xff);
    return bytes;
}

std::string flatten(const grpc::ByteBuffer& buffer) {
    std::vector<grpc::Slice> slices;
    REQUIRE(buffer.Dump(&slices).ok());
    std::string out;
    for (const auto& slice : slices)
        out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    return out;
}

// The bytes as gRPC might hand them over: in slices of `piece` bytes.
grpc::ByteBuffer sliced(const std::string& bytes, size_t piece) {
    std::vector<grpc::Slice> slices;
    for (size_t at = 0; at < bytes.size(); at += piece)
        slices.emplace_back(bytes.substr(at, piece));
    return grpc::ByteBuffer(slices.data(), slices.size());
}

ExchangeWireFrame chunk_frame(uint64_t round, uint32_t part, std::vector<std::byte> bytes) {
    ExchangeWireFrame frame;
    frame.fields.set_round(round);
    frame.fields.set_part(part);
    frame.chunk = std::make_shared<std::vector<std::byte>>(std::move(bytes));
    frame.has_chunk = true;
    return frame;
}

std::string as_string(const std::vector<std::byte>& bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

grpc::Status read_into(const std::string& bytes, size_t piece, ExchangeWireFrame& frame) {
    grpc::ByteBuffer buffer = sliced(bytes, piece);
    return Traits::Deserialize(&buffer, &frame);
}

}  // namespace

TEST_CASE("a chunk frame written without protobuf parses as the protobuf ExchangeFrame") {
    const auto bytes = random_bytes((1u << 20) + 13, 1);
    const ExchangeWireFrame frame = chunk_frame(77, 1, bytes);
    grpc::ByteBuffer buffer;
    bool own = false;
    REQUIRE(Traits::Serialize(frame, &buffer, &own).ok());
    CHECK(own);
    v1::ExchangeFrame parsed;
    REQUIRE(parsed.ParseFromString(flatten(buffer)));
    CHECK(parsed.round() == 77);
    CHECK(parsed.part() == 1);
    REQUIRE(parsed.body_case() == v1::ExchangeFrame::kChunk);
    CHECK(parsed.chunk() == as_string(bytes));
}

TEST_CASE("the sent chunk is referenced, not copied, and released once gRPC drops it") {
    ExchangeWireFrame frame = chunk_frame(1, 0, random_bytes(4096, 2));
    const ChunkBuffer chunk = frame.chunk;
    const std::string expected = as_string(*chunk);
    {
        grpc::ByteBuffer buffer;
        bool own = false;
        REQUIRE(Traits::Serialize(frame, &buffer, &own).ok());
        frame.chunk.reset();
        CHECK(chunk.use_count() == 2);  // ours and the buffer's
        v1::ExchangeFrame parsed;
        REQUIRE(parsed.ParseFromString(flatten(buffer)));
        CHECK(parsed.chunk() == expected);
    }
    CHECK(chunk.use_count() == 1);
}

TEST_CASE("a protobuf ExchangeFrame reads back as a wire frame however it is sliced") {
    const auto bytes = random_bytes(100000, 3);
    v1::ExchangeFrame sent;
    sent.set_round(123456789012ull);
    sent.set_part(1);
    sent.set_chunk(as_string(bytes));
    const std::string wire = sent.SerializeAsString();
    for (size_t piece : {size_t{1}, size_t{7}, size_t{4096}, wire.size()}) {
        CAPTURE(piece);
        ExchangeWireFrame frame;
        REQUIRE(read_into(wire, piece, frame).ok());
        CHECK(frame.fields.round() == sent.round());
        CHECK(frame.fields.part() == 1);
        CHECK(frame.fields.body_case() == v1::ExchangeFrame::BODY_NOT_SET);
        REQUIRE(frame.has_chunk);
        CHECK(*frame.chunk == bytes);
    }
}

TEST_CASE("header, abort and receipt frames go both ways unchanged") {
    v1::ExchangeFrame header, abort, receipt;
    header.set_round(5);
    header.set_header(std::string(64, 'h'));
    abort.set_round(5);
    abort.set_part(1);
    abort.set_abort("the encoder refused a NaN");
    receipt.set_round(5);
    receipt.mutable_receipt()->set_complete(false);
    receipt.mutable_receipt()->set_error("chunk 3: checksum mismatch");
    for (const v1::ExchangeFrame* sent : {&header, &abort, &receipt}) {
        ExchangeWireFrame frame;
        REQUIRE(read_into(sent->SerializeAsString(), 3, frame).ok());
        CHECK_FALSE(frame.has_chunk);
        CHECK(frame.fields.SerializeAsString() == sent->SerializeAsString());

        grpc::ByteBuffer buffer;
        bool own = false;
        REQUIRE(Traits::Serialize(frame, &buffer, &own).ok());
        CHECK(flatten(buffer) == sent->SerializeAsString());
    }
}

TEST_CASE("reading frame after frame reuses the chunk buffer unless someone still holds it") {
    v1::ExchangeFrame sent;
    sent.set_chunk(std::string(1000, 'a'));
    ExchangeWireFrame frame;
    REQUIRE(read_into(sent.SerializeAsString(), 100, frame).ok());
    const std::vector<std::byte>* first = frame.chunk.get();
    sent.set_chunk(std::string(500, 'b'));
    REQUIRE(read_into(sent.SerializeAsString(), 100, frame).ok());
    CHECK(frame.chunk.get() == first);
    CHECK(frame.chunk->size() == 500);

    const ChunkBuffer held = frame.chunk;
    sent.set_chunk(std::string(10, 'c'));
    REQUIRE(read_into(sent.SerializeAsString(), 100, frame).ok());
    CHECK(frame.chunk.get() != held.get());
    CHECK(as_string(*held) == std::string(500, 'b'));
    CHECK(as_string(*frame.chunk) == std::string(10, 'c'));

    sent.set_abort("no chunk this time");
    REQUIRE(read_into(sent.SerializeAsString(), 100, frame).ok());
    CHECK_FALSE(frame.has_chunk);
    CHECK(frame.fields.abort() == "no chunk this time");
}

TEST_CASE("the buffer pool hands out a buffer again only once nobody else holds it") {
    ChunkBufferPool pool;
    ChunkBuffer a = pool.take();
    ChunkBuffer b = pool.take();
    CHECK(a.get() != b.get());
    const auto* a_address = a.get();
    a.reset();
    CHECK(pool.take().get() == a_address);
}

TEST_CASE("fields protobuf would skip are skipped here too") {
    v1::ExchangeFrame sent;
    sent.set_round(9);
    sent.set_chunk("abc");
    std::string wire = sent.SerializeAsString();
    wire += std::string("\xa0\x06\x2a", 3);                       // field 100, varint 42
    wire += std::string("\xa9\x06", 2) + std::string(8, '\x01');  // field 101, fixed64
    wire += std::string("\xb5\x06", 2) + std::string(4, '\x02');  // field 102, fixed32
    wire += std::string("\xba\x06\x02zz", 5);                     // field 103, 2 bytes
    ExchangeWireFrame frame;
    REQUIRE(read_into(wire, 5, frame).ok());
    CHECK(frame.fields.round() == 9);
    REQUIRE(frame.has_chunk);
    CHECK(as_string(*frame.chunk) == "abc");
}

TEST_CASE("malformed frames are refused with a status naming the problem") {
    v1::ExchangeFrame sent;
    sent.set_round(3);
    sent.set_chunk(std::string(300, 'x'));
    const std::string whole = sent.SerializeAsString();

    auto refusal = [](const std::string& bytes) {
        ExchangeWireFrame frame;
        const grpc::Status status = read_into(bytes, 16, frame);
        CHECK(status.error_code() == grpc::StatusCode::INTERNAL);
        return status.error_message();
    };

    SECTION("cut anywhere inside the chunk or its length") {
        for (size_t cut : {size_t{3}, size_t{4}, size_t{10}, whole.size() - 1})
            CHECK_THAT(refusal(whole.substr(0, cut)), Catch::Contains("malformed exchange frame"));
    }
    SECTION("a length beyond the frame") {
        CHECK_THAT(refusal(std::string("\x1a\xff\xff\x03", 4) + "abc"),
                   Catch::Contains("chunk longer than the frame"));
        CHECK_THAT(refusal(std::string("\x12\x40", 2) + "short"),
                   Catch::Contains("field 2 is longer than the frame"));
    }
    SECTION("a varint of more than ten bytes") {
        CHECK_THAT(refusal(std::string("\x08") + std::string(11, '\xff')),
                   Catch::Contains("field 1 cut short"));
        CHECK_THAT(refusal(std::string(11, '\xff')), Catch::Contains("field tag cut short"));
    }
    SECTION("a group wire type") {
        CHECK_THAT(refusal(std::string("\x0b", 1)), Catch::Contains("wire type 3"));
    }
    SECTION("a chunk and a header in one frame") {
        v1::ExchangeFrame header;
        header.set_header("h");
        CHECK_THAT(refusal(whole + header.SerializeAsString()),
                   Catch::Contains("a chunk and another body"));
    }
    SECTION("fields that are not an ExchangeFrame's") {
        // Field 5 (the receipt) holding bytes that are not a receipt.
        CHECK_THAT(refusal(std::string("\x2a\x02\x08", 3) + std::string(1, '\xff')),
                   Catch::Contains("do not parse"));
    }
    SECTION("a frame with a chunk and another body cannot be sent either") {
        ExchangeWireFrame frame = chunk_frame(1, 0, random_bytes(8, 4));
        frame.fields.set_abort("both");
        grpc::ByteBuffer buffer;
        bool own = false;
        CHECK(Traits::Serialize(frame, &buffer, &own).error_code() == grpc::StatusCode::INTERNAL);
    }
}

TEST_CASE("Exchange's place among service Peer's methods is the generated one") {
    const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
        v1::Peer::service_full_name());
    REQUIRE(service != nullptr);
    CHECK(service->method(exchange_method_index(ExchangeMethod::Exchange))->full_name() ==
          "starling.v1.Peer.Exchange");
    CHECK(service->method(exchange_method_index(ExchangeMethod::RelayExchange))->full_name() ==
          "starling.v1.Peer.RelayExchange");
}

TEST_CASE(
    "mutated frames read as protobuf reads them, or are refused where protobuf refuses them") {
    std::vector<std::string> seeds;
    {
        v1::ExchangeFrame frame;
        frame.set_round(300);
        frame.set_part(1);
        frame.set_chunk(std::string(200, 'c'));
        seeds.push_back(frame.SerializeAsString());
        frame.set_header(std::string(64, 'h'));
        seeds.push_back(frame.SerializeAsString());
        frame.set_abort("encoder failed");
        seeds.push_back(frame.SerializeAsString());
        frame.mutable_receipt()->set_error("checksum mismatch");
        seeds.push_back(frame.SerializeAsString());
    }
    std::mt19937 rng(11);
    const auto below = [&](size_t n) {
        return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n);
    };
    size_t parsed = 0, refused = 0;
    for (int i = 0; i < 20000; ++i) {
        std::string bytes = seeds[below(seeds.size())];
        for (size_t m = 0, mutations = 1 + below(4); m < mutations; ++m) {
            switch (below(4)) {
                case 0:
                    if (!bytes.empty()) bytes[below(bytes.size())] = static_cast<char>(rng());
                    break;
                case 1: bytes.resize(below(bytes.size() + 1)); break;
                case 2:
                    bytes.insert(below(bytes.size() + 1),
                                 std::string(1 + below(3), static_cast<char>(rng())));
                    break;
                default: bytes += seeds[below(seeds.size())].substr(0, below(40)); break;
            }
        }
        CAPTURE(i, bytes.size());
        v1::ExchangeFrame reference;
        const bool reference_ok = reference.ParseFromString(bytes);
        ExchangeWireFrame frame;
        const grpc::Status status = read_into(bytes, 1 + below(64), frame);
        if (!status.ok()) {
            ++refused;
            CHECK(status.error_code() == grpc::StatusCode::INTERNAL);
            // Stricter than protobuf in two respects only: a chunk and another body in one frame,
            // and groups (a deprecated wire type no ExchangeFrame writer emits).
            if (reference_ok)
                CHECK_THAT(status.error_message(), Catch::Contains("a chunk and another body") ||
                                                       Catch::Contains("wire type 3"));
            continue;
        }
        ++parsed;
        REQUIRE(reference_ok);
        CHECK(frame.fields.round() == reference.round());
        CHECK(frame.fields.part() == reference.part());
        if (frame.has_chunk) {
            REQUIRE(reference.body_case() == v1::ExchangeFrame::kChunk);
            CHECK(as_string(*frame.chunk) == reference.chunk());
        } else {
            CHECK(frame.fields.SerializeAsString() == reference.SerializeAsString());
        }
    }
    // Both outcomes must have been reached for the comparison to mean anything.
    CHECK(parsed > 1000);
    CHECK(refused > 1000);
}
