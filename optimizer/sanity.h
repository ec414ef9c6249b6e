// The sane() check of docs/spec.md section 4: a partner's decoded values join the outer
// step only if every one is finite and their distance from this node's own values is not far
// beyond the usual. A corrupt, mismatched or hostile state otherwise drags phi away in one round.
#pragma once

#include <cstddef>
#include <deque>
#include <optional>
#include <span>
#include <string>

namespace starling {

class MessageSanity {
public:
    // Refuses a distance above factor times a reference: the larger of this node's own update in
    // the round (the norm of its D) and the median of the last `window` distances it accepted.
    // The own update judges from the first round on, before any history: an honest partner that
    // trained on other data with the same schedule differs from this node by about one update,
    // while a diverged or mistyped learning rate differs by orders of magnitude. The history lets
    // the distance grow beyond one update as replicas drift apart over many rounds.
    explicit MessageSanity(double factor = 10.0, size_t window = 8);

    // Empty when the message may be used, otherwise why not. Only accepted distances join the
    // history, so a partner that keeps sending outsized messages is refused for as long as it
    // does. own_update is the norm of this node's D this round; with no update and no history
    // (a node that trained no step yet) only size and finiteness are judged.
    std::optional<std::string> check(std::span<const float> decoded, std::span<const float> own,
                                     double own_update);

private:
    double factor_;
    size_t window_;
    std::deque<double> accepted_;
};

// A NoLoCo partner's update points away from this node's: empty when the cosine of
// (partner - base) with (own - base) is at least kMinUpdateCosine (or either is zero), otherwise
// why not; base empty counts as zeros. Replicas of one swarm trained from nearby phis on the same
// distribution move alike, but with few inner steps their updates are mostly noise: honest
// partners scored 0.03 to 0.98 in the swarm experiment (H = 25) and down to -0.15 among pico
// daemons at H = 8. A sign-flipped update scores -0.5 to -0.97 in its first rounds, a replica
// decaying towards zero as low as -0.76, while a distance test passes both whenever their norm is
// ordinary.
inline constexpr double kMinUpdateCosine = -0.5;
std::optional<std::string> opposed_update(std::span<const float> partner,
                                          std::span<const float> own, std::span<const float> base);

// A split NoLoCo partner's D no more aligned with this node's own D than one of random signs
// would be: with s the sum of p_i d_i over the coordinates and sigma = sqrt(sum of p_i^2 d_i^2),
// the spread s would have if each p_i's sign were a coin toss (a D independent of this node's,
// sparse or heavy-tailed alike), refused when the score s / sigma is under kMinUpdateAlignment.
// Noise of a matched norm scores within 2 of 0, a replica trained on random bytes within 5 past
// its first rounds; honest partners that trained the same tokens scored 75 to 248 in the swarm
// experiment (split, H 25, 123,200 values, 400 steps) and 35 to 276 among pico daemons at H 8; a
// flipped D scores below -19. Late in training honest D's align less, and at times not at all:
// AlignmentPower says when the test can still part them, and TOPK D's sent with error feedback
// are not judged (PartnerChecks::judge_alignment). A node can tell only because split messages
// carry D itself: a fused theta holds the partner's phi too, whose drift from this node's sets
// the sign (docs/security.md). alignment_score is empty when fewer than kMinAlignmentTerms
// coordinates are nonzero in both D's (s is at most sqrt of their count times sigma, so even
// equal D's could not pass; a zero D is idle_update's); unaligned_update is empty when aligned
// or not scored, otherwise why not.
inline constexpr double kMinUpdateAlignment = 4.0;
inline constexpr size_t kMinAlignmentTerms = 64;
struct Alignment {
    double score = 0.0;  // s / sigma
    size_t terms = 0;    // coordinates nonzero in both D's
};
std::optional<Alignment> alignment_score(std::span<const float> partner,
                                         std::span<const float> own);
std::optional<std::string> unaligned_update(std::span<const float> partner,
                                            std::span<const float> own);
std::optional<std::string> unaligned_score(double score);

// Whether the alignment test can part honest partners from noise now. Noise scores within 2 of
// 0 whatever the swarm does, but honest scores fall as the members' updates stop sharing a
// direction: among 4 pico daemons at the learning rate's peak the correlation of two honest D's
// fell from 0.24 at the median to 0.10, at or under 0 in 5% of rounds (docs/security.md), where
// a bar of 4 refused a third of them. A score grows with the root of its terms, and a swarm's
// honest spread with it, so what says whether the test can tell is the score over that root
// (about the correlation of two D's of normal values). The test judges while the lower median of
// it over the last kAlignmentPowerWindow partners taken is at least kMinAlignmentPower (and while
// fewer than kAlignmentPowerMinScores are known: from the first round), and stands aside below
// it. Over those daemons' 830 judgements at the update sample (8192 coordinates, where 0.18 is a
// score of 16) it judged 132 and refused no honest partner; a bar of 4 on all refused 154. Only
// partners taken join, so a member whose messages the test refuses cannot lower the median that
// keeps it judging.
inline constexpr double kMinAlignmentPower = 0.18;
inline constexpr size_t kAlignmentPowerWindow = 8;
inline constexpr size_t kAlignmentPowerMinScores = 4;
class AlignmentPower {
public:
    bool judging() const;
    void taken(const Alignment& alignment);

private:
    std::deque<double> per_root_term_;
};

// A split NoLoCo partner's D under kMinUpdateRatio times this node's own as it sent it, where
// the partner trained at least this node's tokens: a replica that barely moved (one whose every
// inner step was skipped for a NaN gradient sends D = 0, which any distance test passes and whose
// weights, phi + 0, score as well as phi), and which would halve this node's update in the mean.
// Honest members that trained as much move alike: AdamW's steps are near lr in every coordinate.
// Empty when it moved enough, or when this node's own D is zero; otherwise why not.
inline constexpr double kMinUpdateRatio = 0.1;
std::optional<std::string> idle_update(std::span<const float> partner, std::span<const float> own);

// A NoLoCo partner's values that are this node's own message sent back (an echo): a member that
// echoes takes this node's values and gives none, and the round counts as paired while this node
// in effect steps alone. Empty when the partner's values (theta fused, D split) lie at least
// kMinEchoDistance times this node's own update from what it sent (`sent`, its message as its
// partners decode it); otherwise why not. An echo re-encodes decoded values, which lands within a
// rounding step of them. Honest partners trained other data, and in the swarm experiment (fused,
// H 25, 320 judgements) lay 0.20 to 0.29 times the node's own update from what it sent in the
// first round, where every replica starts from the same phi, and 0.92 or more in 9 of 10 after.
inline constexpr double kMinEchoDistance = 0.05;
std::optional<std::string> echoed_message(std::span<const float> partner,
                                          std::span<const float> sent, double own_update);

// The index of the first value that is NaN or infinite, if any.
std::optional<size_t> first_non_finite(std::span<const float> values);

// |a - b|, or |a| when b is empty, summed in double in index order (the same bits everywhere).
double euclidean_distance(std::span<const float> a, std::span<const float> b);

// The same judgement for whole states, where there is no own update to measure against: a state
// copy (daemon/swarm/snapshot_check.h) weighs a donor's norm of phi against the median of `votes`
// (the norms of every donor's phi and this node's own). Empty when `norm` is finite and within
// `factor` of that median, above or below; otherwise why not. Far is a ratio, so the median is
// taken on a log scale: for an even count, the geometric mean of the middle two. Two votes (a
// lone donor beside this node's own) may then be up to factor squared apart before either is far,
// room for a swarm whose weights grew well past a fresh node's initialisation; a diverged one's
// 1e11 is not. Votes that are not finite and positive are left out; with none left every finite
// norm passes.
std::optional<std::string> far_from_median(double norm, std::span<const double> votes,
                                           double factor);

}  // namespace starling
