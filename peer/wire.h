// Conversions between the membership table and peer.proto, and the names of gRPC status codes.
// Digests from the wire are untrusted: each is checked (public key size, node id derived from it,
// address form, field lengths) and a bad one is dropped with the reason, never merged.
#pragma once

#include <grpcpp/support/status.h>

#include <string>
#include <variant>

#include "peer/membership.h"
#include "starling/v1/peer.pb.h"

namespace starling {

void to_digest(const Member& member, v1::MemberDigest* digest);
// The member, or the reason the digest is unusable.
std::variant<Member, std::string> from_digest(const v1::MemberDigest& digest);

// "DEADLINE_EXCEEDED", ...: what error messages about a call print.
const char* status_code_name(grpc::StatusCode code);

}  // namespace starling
