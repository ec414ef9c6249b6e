// Conversions between the membership table and peer.proto, and the names of gRPC status codes.
// Digests from the wire are untrusted: each is checked (public key size, node id derived from it,
// address form, field lengths) and a bad one is dropped with the reason, never merged.
#pragma once

#include <grpcpp/support/status.h>

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "peer/membership.h"
#include "starling/v1/peer.pb.h"

namespace starling {

void to_digest(const Member& member, v1::MemberDigest* digest);
// The member, or the reason the digest is unusable.
std::variant<Member, std::string> from_digest(const v1::MemberDigest& digest);

// A protobuf bytes field's contents as bytes, and bytes as such a field.
inline std::span<const std::byte> as_bytes(std::string_view field) {
    return std::as_bytes(std::span(field.data(), field.size()));
}
inline std::string as_field(std::span<const std::byte> bytes) {
    return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// "DEADLINE_EXCEEDED", ...: what error messages about a call print.
const char* status_code_name(grpc::StatusCode code);

}  // namespace starling
