// One node's outer step at the end of a round, as docs/spec.md section 4 (NoLoCo) and
// 7.3 (DiLoCo) spell it out, on top of the arithmetic of outer.h: which values enter the group
// means, in which order, and what happens when partners are missing or refused. The experiment
// harness and the daemon both call these, so a simulated swarm and a real one step alike.
#pragma once

#include <cstdint>
#include <functional>
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
    // Split only; a partner's is empty in rounds whose messages carry D alone
    // ([exchange].phi_every): its weights are then taken as this node's phi + its D.
    std::span<const float> phi;
    // Its share of the group means: the tokens it trained in the round where members train
    // unequal amounts (token-budget rounds, docs/uneven.md); equal weights are the plain mean.
    // A partner's is its claim, counted at most kMaxTokenRatio times this node's own.
    double weight = 1.0;
    // This node's own values as its partners decode them (theta fused, D split): a partner's
    // values this close are an echo (echoed_message). In split mode, where a sparse or lossy
    // codec sends less than D, the held-out check scores phi + this, so that a partner's phi +
    // decoded D is set against weights made the same way; fused theta differs from what was sent
    // by a rounding step and is scored exactly. Empty: no echo test, and values exactly.
    std::span<const float> sent;
    // Fused only, a partner's update sample: its exact theta and phi at the round's sampled
    // coordinates (PartnerChecks::sample_at), from which its update theta - phi is judged there as
    // a split D is, and how far its decoded theta there may lie from the exact one by the state
    // codec's rounding alone (codec::rounding_bounds): a sample further from the message it came
    // with does not describe it. Its phi is the partner's word, which nothing here can check: a
    // member that rewrites its sample passes (docs/security.md). Empty: none sent.
    std::span<const float> sample_theta, sample_phi, sample_rounding;
};

// No member's tokens count for more than this many times a reference: the node's own in NoLoCo,
// the median member's in DiLoCo. Honest members of one config train within a few times each
// other's tokens (docs/uneven.md), while a claim is only a number in a message header: uncapped,
// a member claiming a billion tokens would make every group mean its own values.
inline constexpr double kMaxTokenRatio = 8.0;

// A NoLoCo partner whose weights score a loss on a held-out batch more than this many times this
// node's own weights is left out, where both trained the same tokens. In the swarm experiment
// honest partners scored within 2.5% of this node's weights, a replica trained on garbage 1.46 to
// 2.8 times, a decaying one (weight decay 30) 1.09 to 1.45 times, a flipped update 1.03 to 1.29,
// noise of the update's norm 1.0 to 1.47. Pico daemons early in training drift further apart: an
// honest partner scored up to 15% above a node's own, a decaying one 6 to 25%
// (tests/integration/test_faulty_member.cpp allows 5 honest refusals in a run). Measuring against
// the worse of this node's weights and its phi instead passed every noise message in the
// experiment and still refused honest pico daemons.
inline constexpr double kMaxHeldOutLossRatio = 1.05;

// The sanity history a node keeps per kind of message.
struct PartnerChecks {
    MessageSanity state;  // theta or phi messages
    MessageSanity delta;  // D messages
    // false: every partner's values enter at the weight it claims, unjudged (the fault study's
    // baseline without defences; never in starlingd).
    bool judge = true;
    // false: split D's are not judged for alignment (unaligned_update). Sparse TOPK D's sent with
    // error feedback lose their alignment late in training: over the swarm experiment's 1000
    // steps honest ones scored -3.1 to 3.9 in 10 of 320 judgements of its last 16 rounds, where
    // dense Q8 D's scored under 4 in 2 of 240 (docs/security.md).
    bool judge_alignment = true;
    // Whether the alignment test can still part honest partners from noise.
    AlignmentPower alignment_power;
    // The loss of whole weights (theta) on a batch neither member trained on; empty: no such
    // check. What the cheaper tests cannot tell (a replica trained on garbage, an update whose
    // norm and direction look ordinary) shows as a worse model.
    std::function<double(std::span<const float>)> held_out_loss;
    // Fused: the coordinates of this round's update sample (sample_coordinates), which partners'
    // MemberValues::sample_theta and sample_phi hold theta and phi at.
    std::span<const uint64_t> sample_at;
};

// The coordinates of fused NoLoCo's update sample in `round`: `count` distinct ones of `size`, in
// increasing order (every one where count >= size). Drawn from the round alone, so that both
// members of a pair, which exchange in the same round, draw the same ones; a new draw each round,
// so that no part of the weights goes unjudged.
std::vector<uint64_t> sample_coordinates(uint64_t round, uint64_t size, uint64_t count);

// A partner's values the step left out.
struct Refusal {
    uint64_t member = 0;
    std::string why;  // naming the member
    // The node's own values are what is broken (not finite, or scoring NaN on the held-out
    // batch): the message was not judged, and must not count against its author.
    bool own_fault = false;
};

struct NoLoCoStep {
    int members = 1;               // values that entered the step, own included; 1 = solo
    std::vector<Refusal> refused;  // one per partner left out
    // Per partner, in the order given: its weights' loss on the held-out batch over this node's
    // own; NaN where it was not scored (refused first, fewer tokens claimed, no held-out batch).
    std::vector<double> held_out_ratios;
};

// NoLoCo: a node whose own values (theta or D, and phi) are not finite, or whose weights score a
// loss that is not finite on the held-out batch, leaves every partner out unjudged (own_fault) and
// steps alone; otherwise partners whose values fail the sanity check or are this node's own sent
// back (echoed_message, where self.sent is given) or, split, whose D barely moved though it trained
// at least this node's tokens (idle_update) or is no more aligned with this node's own D than
// random signs would be though both trained the same tokens (unaligned_update, where
// checks.judge_alignment), or, fused with an update sample (at checks.sample_at), whose sample is
// not finite or further from its theta than rounding or whose theta - phi there fails the same two
// tests against this node's, are left out, and
// so is one that trained at least this node's tokens (a weight at least its own: every H-step
// round, and a token-budget round's partner that claims as many or more) whose weights score more
// than kMaxHeldOutLossRatio times this node's own as its partners receive them (self.sent) on
// checks.held_out_loss (or, without one and where alignment is not judged and no update sample
// came, whose update points away from this node's though both trained the same tokens:
// opposed_update); the rest and the node's own exact values are averaged in node-id order (split:
// phi over the members that sent it, and no pull where no partner did); with no partner left the
// node takes a solo step (its own D only) and never waits. self.phi must be the phi span being
// updated (split mode). scratch_a and scratch_b hold the group means (phi.size() floats each).
NoLoCoStep noloco_outer_step(const OuterConfig& config, MessageMode mode, const MemberValues& self,
                             std::span<const MemberValues> partners, PartnerChecks& checks,
                             std::span<float> phi, std::span<float> momentum,
                             std::span<float> scratch_a, std::span<float> scratch_b);

// DiLoCo leaves out a D whose cosine with the others' sum is below this fraction of the median
// member's. Honest D's of one round point alike, less so in short rounds: in the swarm experiment
// 0.3% of honest D's fell below half the median at H 10 (2.4% below 0.7 of it), none at H 50; a
// sign flip, noise or garbage data score 0 or less, weight decay 30 below 0.2 from round 3.
inline constexpr double kMinCosineOfMedian = 0.5;
// DiLoCo leaves out a D that points more the way of the last outer step than the others' D's
// do, by this much: its cosine with the outer momentum less its cosine with the others' sum
// exceeds the median member's by more than it. Honest D's start from this round's phi, so they
// agree with each other about as well as with the last step; a D kept back a round (a replay of
// the member's own earlier update) started from the last round's phi and agrees with that step as
// the others did then. In the swarm experiment (8 members, H 50, 1000 steps, seeds 1-3, and
// uneven speeds with token budgets) honest D's came to at most 0.15 above the median, a one-round
// replay 0.3 to 0.66 above it in its first 5 rounds, and later as close as honest ones: late in
// training each round's D's point much as the last round's did, and a stale D is a current one's
// near copy.
inline constexpr double kStaleMargin = 0.25;
// With 3 or more D's, one whose norm exceeds this many times the norm it is allowed is left out
// rather than clipped, as sane() refuses a NoLoCo message 10 updates away: no honest D comes near.
inline constexpr double kFarAboveAllowed = 10.0;

struct DiLoCoStep {
    int members = 0;                 // D's that entered the mean; 0: no step was taken
    std::vector<size_t> not_finite;  // indices into decoded left out: a NaN or infinity
    std::vector<size_t> clipped;     // indices scaled down to the norm allowed
    std::vector<size_t> off_course;  // indices left out: pointing away from the others
    std::vector<size_t> too_large;   // indices left out: kFarAboveAllowed times the norm allowed
    std::vector<size_t> stale;       // indices left out: pointing the last outer step's way
    // Per index into decoded: its cosine with the others' clipped, weighted sum; NaN where not
    // judged (not finite, or fewer than 3 finite D's). median_cosine: the lower middle one.
    std::vector<double> cosines;
    double median_cosine = 0.0;
    // Per index into decoded: its cosine with the outer momentum less its cosine with the others'
    // sum, the others being the D's not left out as too large or off course; NaN where not judged
    // (as cosines, for a D so left out, where fewer than 3 remain, and where the momentum or the
    // D is zero). median_staleness: the lower middle one.
    std::vector<double> staleness;
    double median_staleness = 0.0;
};

// DiLoCo: the mean of every quorum member's decoded D (own included, decoded from what it sent),
// in the order given (node-id order), then the outer step; every member gets the same bits, for
// every member decides alike on the same inputs. weights, when given, weigh each member's D by
// the tokens it trained (group_mean), each at most kMaxTokenRatio times the median weight of the
// members kept, and at most the square of its D's norm over the median norm times it (a claim the
// D's size does not back counts for no more). A minority cannot steer the mean: a D that is not
// finite is left out; a D whose norm exceeds the median norm (the lower of the two middle ones for
// an even count), times its weight over the median weight where that is above 1, is scaled down
// to it; and with 3 or more D's, one more than kFarAboveAllowed times its allowed norm, whose
// cosine with the others' sum is below kMinCosineOfMedian times the median member's (when that
// is positive) is left out; then, among 3 or more D's still in, one whose staleness (against
// their sum) exceeds the median member's by kStaleMargin (momentum holds the last outer step on
// entry). A member that claims its real tokens thus moves phi by at most its share of one
// typical update, in the direction the others take. With no finite D the node takes no step. judge
// false: the plain (weighted) mean of every D, unjudged (the fault study's baseline without
// defences; never in starlingd).
DiLoCoStep diloco_outer_step(const OuterConfig& config,
                             std::span<const std::span<const float>> decoded, std::span<float> phi,
                             std::span<float> momentum, std::span<float> scratch,
                             std::span<const double> weights = {}, bool judge = true);

}  // namespace starling
