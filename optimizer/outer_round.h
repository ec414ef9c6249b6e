// One node's outer step at the end of a round, as docs/spec.md section 4 (NoLoCo) and
// 7.3 (DiLoCo) spell it out, on top of the arithmetic of outer.h: which values enter the group
// means, in which order, and what happens when partners are missing or refused. The experiment
// harness and the daemon both call these, so a simulated swarm and a real one step alike.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "optimizer/outer.h"
#include "optimizer/sanity.h"

namespace starling {

enum class MessageMode : uint8_t {
    Fused,  // NoLoCo messages carry theta only (needs pull == lr)
    Split,  // NoLoCo messages carry D = theta - phi and phi
};
std::string_view message_mode_name(MessageMode mode);  // "fused", "split"
MessageMode message_mode_from_name(std::string_view name);

// A group member's values: this node's own exactly, a partner's as its message decoded.
struct MemberValues {
    uint64_t node_id = 0;
    std::span<const float> values;  // fused: theta; split: D
    std::span<const float> phi;     // split only
    // Its share of the group means: the tokens it trained in the round where members train
    // unequal amounts (token-budget rounds, docs/uneven.md); equal weights are the plain mean.
    // A partner's is its claim, counted at most kMaxTokenRatio times this node's own.
    double weight = 1.0;
};

// No member's tokens count for more than this many times a reference: the node's own in NoLoCo,
// the median member's in DiLoCo. Honest members of one config train within a few times each
// other's tokens (docs/uneven.md), while a claim is only a number in a message header: uncapped,
// a member claiming a billion tokens would make every group mean its own values.
inline constexpr double kMaxTokenRatio = 8.0;

// The sanity history a node keeps per kind of message.
struct PartnerChecks {
    MessageSanity state;  // theta or phi messages
    MessageSanity delta;  // D messages
};

// A partner's values the step left out.
struct Refusal {
    uint64_t member = 0;
    std::string why;  // naming the member
};

struct NoLoCoStep {
    int members = 1;               // values that entered the step, own included; 1 = solo
    std::vector<Refusal> refused;  // one per partner left out
};

// NoLoCo: partners whose values fail the sanity check are left out; the rest and the node's own
// exact values are averaged in node-id order; with no partner left the node takes a solo step
// (its own D only) and never waits. self.phi must be the phi span being updated (split mode).
// scratch_a and scratch_b hold the group means (phi.size() floats each).
NoLoCoStep noloco_outer_step(const OuterConfig& config, MessageMode mode, const MemberValues& self,
                             std::span<const MemberValues> partners, PartnerChecks& checks,
                             std::span<float> phi, std::span<float> momentum,
                             std::span<float> scratch_a, std::span<float> scratch_b);

struct DiLoCoStep {
    int members = 0;                 // D's that entered the mean; 0: no step was taken
    std::vector<size_t> not_finite;  // indices into decoded left out: a NaN or infinity
    std::vector<size_t> clipped;     // indices scaled down to the norm allowed
};

// DiLoCo: the mean of every quorum member's decoded D (own included, decoded from what it sent),
// in the order given (node-id order), then the outer step; every member gets the same bits, for
// every member decides alike on the same inputs. weights, when given, weigh each member's D by
// the tokens it trained (group_mean), each at most kMaxTokenRatio times the median weight of the
// members kept. A minority cannot steer the mean: a D that is not finite is left out, and a D whose
// norm exceeds the median norm (the lower of the two middle ones for an even count), times its
// weight over the median weight where that is above 1, is scaled down to it. A member that claims
// its real tokens thus moves phi by at most its share of one typical update. With no finite D the
// node takes no step.
DiLoCoStep diloco_outer_step(const OuterConfig& config,
                             std::span<const std::span<const float>> decoded, std::span<float> phi,
                             std::span<float> momentum, std::span<float> scratch,
                             std::span<const double> weights = {});

}  // namespace starling
