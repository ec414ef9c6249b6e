#include "peer/wire.h"

#include <algorithm>
#include <fmt/format.h>

#include "peer/address.h"

namespace starling {
namespace {

constexpr size_t kMaxAddress = 262;  // a DNS name of 253, brackets, a colon and a port
constexpr size_t kMaxLabel = 128;    // fingerprint, swarm id
constexpr size_t kMaxModel = 512;    // the model's signature
constexpr double kMaxStepSeconds = 86400.0;

}  // namespace

void to_digest(const Member& member, v1::MemberDigest* digest) {
    digest->set_node_id(member.node_id);
    digest->set_address(member.address);
    digest->set_incarnation(member.incarnation);
    digest->set_state(static_cast<v1::MemberState>(static_cast<int>(member.state)));
    digest->set_round(member.round);
    digest->set_paired_through(member.paired_through);
    digest->set_solo_through(member.solo_through);
    digest->set_step_seconds(member.step_seconds);
    digest->set_fingerprint(member.fingerprint);
    digest->set_model(member.model);
    digest->set_method(member.method);
    digest->set_reachability(static_cast<v1::Reachability>(static_cast<int>(member.reachability)));
    for (const uint64_t anchor : member.anchors) digest->add_anchors(anchor);
    digest->set_protocol_version(member.protocol_version);
    digest->set_swarm_id(member.swarm_id);
    digest->set_public_key(member.public_key.data(), member.public_key.size());
    digest->set_instance(member.instance);
}

std::variant<Member, std::string> from_digest(const v1::MemberDigest& digest) {
    if (digest.public_key().size() != kPublicKeyBytes)
        return fmt::format("public key of {} bytes, expected {}", digest.public_key().size(),
                           kPublicKeyBytes);
    Member member;
    std::copy(digest.public_key().begin(), digest.public_key().end(), member.public_key.begin());
    member.node_id = digest.node_id();
    if (node_id_from_public_key(member.public_key) != member.node_id)
        return fmt::format("node id {} does not match its public key",
                           format_node_id(member.node_id));
    if (digest.address().size() > kMaxAddress || !parse_host_port(digest.address()))
        return fmt::format("node {}: address is not host:port", format_node_id(member.node_id));
    if (digest.fingerprint().size() > kMaxLabel || digest.swarm_id().size() > kMaxLabel)
        return fmt::format("node {}: fingerprint or swarm id longer than {} bytes",
                           format_node_id(member.node_id), kMaxLabel);
    if (digest.method().size() > kMaxLabel)
        return fmt::format("node {}: method longer than {} bytes", format_node_id(member.node_id),
                           kMaxLabel);
    if (digest.model().size() > kMaxModel)
        return fmt::format("node {}: model signature longer than {} bytes",
                           format_node_id(member.node_id), kMaxModel);
    // A day per step is far beyond any model this runs; a larger, negative or NaN figure is junk.
    if (!(digest.step_seconds() >= 0.0 && digest.step_seconds() <= kMaxStepSeconds))
        return fmt::format("node {}: step time {} s is not between 0 and {} s",
                           format_node_id(member.node_id), digest.step_seconds(), kMaxStepSeconds);
    if (static_cast<size_t>(digest.anchors_size()) > kMaxAnchors)
        return fmt::format("node {}: {} anchors, at most {}", format_node_id(member.node_id),
                           digest.anchors_size(), kMaxAnchors);
    const int state = digest.state();
    if (state < static_cast<int>(MemberState::Alive) || state > static_cast<int>(MemberState::Left))
        return fmt::format("node {}: unknown member state {}", format_node_id(member.node_id),
                           state);
    member.address = digest.address();
    member.incarnation = digest.incarnation();
    member.state = static_cast<MemberState>(state);
    member.round = digest.round();
    member.paired_through = digest.paired_through();
    member.solo_through = digest.solo_through();
    member.step_seconds = digest.step_seconds();
    member.fingerprint = digest.fingerprint();
    member.model = digest.model();
    member.method = digest.method();
    // A value this version does not know (a newer member's) says nothing it can use.
    if (digest.reachability() == v1::REACHABILITY_PUBLIC ||
        digest.reachability() == v1::REACHABILITY_PRIVATE)
        member.reachability = static_cast<Reachability>(static_cast<int>(digest.reachability()));
    member.anchors.assign(digest.anchors().begin(), digest.anchors().end());
    member.protocol_version = digest.protocol_version();
    member.swarm_id = digest.swarm_id();
    member.instance = digest.instance();
    return member;
}

const char* status_code_name(grpc::StatusCode code) {
    switch (code) {
        case grpc::StatusCode::OK: return "OK";
        case grpc::StatusCode::CANCELLED: return "CANCELLED";
        case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
        case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
        case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
        case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
        case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
        case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
        case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
        case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
        case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
        case grpc::StatusCode::ABORTED: return "ABORTED";
        case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
        case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
        case grpc::StatusCode::INTERNAL: return "INTERNAL";
        case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
        case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
        default: return "UNRECOGNIZED";
    }
}

}  // namespace starling
