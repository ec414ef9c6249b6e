// Outer steps: what a node does with its slow weights phi at the end of a round of H inner steps.
//
// One sign convention inside the code. The round's displacement is D = theta - phi (fast minus
// slow: where the inner steps went). Every outer step is
//     g     = lr * mean_G(D) - pull * (phi - mean_G(phi))      the update signal
//     delta = momentum * delta + g                             the outer momentum
//     phi  += delta                  (heavy-ball, the default)
//     phi  += g + momentum * delta   (Nesterov's look-ahead)
// and then theta = phi. G is the group the node averaged with this round (itself included); the
// node's own D and phi are exact, the others' are what their messages decoded to.
//
// How each paper's convention maps onto it:
// - NoLoCo (arXiv 2506.10911, Eq. 1-3, with the sign of its released code and Appendix A, since
//   the paper's "-beta" points the wrong way for D = fast - slow):
//       delta_i = alpha delta_i + beta mean_G(theta_j - phi_j) - gamma (phi_i - mean_G phi_j)
//   is heavy-ball with momentum = alpha, lr = beta, pull = gamma.
// - DiLoCo (arXiv 2311.08105) uses the opposite sign, Delta = phi - theta = -D, and torch's
//   Nesterov SGD: b = mu b + Delta; phi = phi - eta (Delta + mu b). Writing delta = -eta b gives
//   delta = mu delta + eta D and phi += eta D + mu delta: Nesterov with momentum = mu, lr = eta.
//   (All replicas share phi, so the pull term is zero.)
// - The heavy-ball DiLoCo of NoLoCo's code, m = mu m - lr mean(phi - theta); phi += m, is
//   heavy-ball with delta = m.
// tests/optimizer/test_outer.cpp checks each mapping against the paper's own formula.
//
// Fused messages: with pull == lr the signal collapses to lr * (mean_G(theta) - phi), so a node
// needs only its partners' theta (one state message) instead of their D and phi.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace starling {

enum class MomentumForm : uint8_t { HeavyBall, Nesterov };

std::string_view momentum_form_name(MomentumForm form);  // "heavyball", "nesterov"
// Throws starling::Error for any other name.
MomentumForm momentum_form_from_name(std::string_view name);

struct OuterConfig {
    float momentum = 0.5f;  // alpha (NoLoCo) or mu (DiLoCo), in [0, 1)
    float lr = 0.7f;        // beta (NoLoCo) or eta (DiLoCo), > 0
    float pull = 0.7f;      // gamma: pull towards the group mean of phi (NoLoCo), >= 0
    MomentumForm form = MomentumForm::HeavyBall;
    void validate() const;  // throws starling::Error naming the field
};

// out = the mean of the members, summed in the order given (the order is part of the result:
// replicas that must agree bit for bit pass the same order). Every span has out.size() elements.
// weights, when given (one per member, positive: the tokens each trained in the round), make it
// the weighted mean sum_k (w_k / sum w) m_k; equal weights give the plain mean bit for bit.
void group_mean(std::span<float> out, std::span<const std::span<const float>> members,
                std::span<const double> weights = {});
// out = sum_k shares[k] members[k], summed in the order given (group_mean's weighted form).
void weighted_sum(std::span<float> out, std::span<const std::span<const float>> members,
                  std::span<const float> shares);

// The general step: mean_displacement = mean_G(D); mean_phi = mean_G(phi), or empty when every
// member's phi is this node's (DiLoCo, a solo round), which drops the pull term.
void outer_step(const OuterConfig& config, std::span<float> phi, std::span<float> delta,
                std::span<const float> mean_displacement, std::span<const float> mean_phi);

// The fused step: g = lr * (mean_theta - phi). Equal to outer_step when pull == lr; also the solo
// step (mean_theta = own theta), where the pull term vanishes whatever its weight.
void outer_step_towards(const OuterConfig& config, std::span<float> phi, std::span<float> delta,
                        std::span<const float> mean_theta);

// Overlapped rounds (docs/overlap.md): the outer step of round r lands while the node trains on
// from `start` (the solo step's phi, engine/overlap.h). The steps taken since are kept on top of
// the new phi:
//     theta = phi + (theta - start)
// which is the sequential restart theta = phi when nothing trained in between (bit for bit: the
// difference is then exactly zero), and the sequential round exactly whenever an inner update
// does not depend on where it starts.
template <typename T>
void rebase_onto_phi(std::span<T> theta, std::span<const T> phi, std::span<const T> start) {
    for (size_t i = 0; i < theta.size(); i++) theta[i] = phi[i] + (theta[i] - start[i]);
}

}  // namespace starling
