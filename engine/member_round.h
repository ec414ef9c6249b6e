// One member's side of a round after its inner phase, written once for the daemon and the
// experiment (docs/round.md): what it sends (the plans, encoders and part numbers), where
// answers land (receive arenas and decoders), each member's weight, and the NoLoCo or DiLoCo outer
// step with what arrived, or a solo step. The network is a RoundLink (engine/round_link.h): a
// PeerNode in starlingd, a board in one process in the experiment; the same seeds give the same
// bits through either.
//
// NoLoCo: the member exchanges its message(s) with each partner the link names (fused: theta
// under the state codec, and theta and phi at the round's sampled coordinates; split: D under the
// delta codec and phi under the state codec, at once), then takes noloco_outer_step
// (optimizer/outer_round.h) with every partner's values that arrived whole. DiLoCo: it publishes
// its D, gathers every quorum member's and takes DiLoCo's step with the mean of every decoded D,
// its own decoded from what it sent, in node-id order, so members that gathered the same messages
// land on the same bits. Weights are the tokens each member said, where every member of the step
// said them; equal counts give the plain mean bit for bit.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "codec/message.h"
#include "engine/config.h"
#include "engine/replica.h"
#include "engine/round_link.h"

namespace starling {

// What the exchange and outer step of one round did.
struct RoundOutcome {
    std::optional<uint64_t> partner;  // NoLoCo: the (first) member exchanged with, if any
    size_t quorum = 1;                // DiLoCo: members whose D arrived, own included
    int members = 1;                  // values that entered the outer step, own included
    uint64_t bytes_sent = 0;          // every message this member sent, to every partner
    uint64_t bytes_received = 0;
    double pair_seconds = 0.0;      // asking the link for partners
    double exchange_seconds = 0.0;  // the exchanges or the gather (0 without a partner)
    bool solo = true;               // the outer step used this member's values only
    std::string failure;  // why values stayed out: exchange errors and refusals, "; " between
    size_t refused = 0;   // messages that arrived and were refused (not finite, not sane)
    // RMS of own theta minus the first partner's, when its message arrived.
    std::optional<double> partner_distance;
    uint64_t partner_tokens = 0;  // what the first partner said it trained on (NoLoCo; 0: not said)
    // NoLoCo: the first partner's weights' loss on the held-out batch over this node's own, where
    // they were scored (optimizer/outer_round.h).
    std::optional<double> partner_held_out;
};

// The plans of a round's messages: the first part's (theta under the state codec for fused
// NoLoCo; D under the delta codec for split NoLoCo and DiLoCo) and the second part's: phi under
// the state codec (split NoLoCo), theta and then phi at [exchange].update_sample coordinates the
// round draws, as F32 (fused NoLoCo; none where update_sample is 0), or none (DiLoCo: an empty
// plan).
struct RoundPlans {
    codec::MessagePlan first, second;
};
RoundPlans round_message_plans(const EngineConfig& config, const ParameterManifest& manifest);

class MemberRound {
public:
    // The plans follow config.method and config.exchange; arenas are sized for `manifest`.
    // Only noloco and diloco step; other methods have the state plan, for what a node reports.
    MemberRound(const EngineConfig& config, const ParameterManifest& manifest);

    // The plan of the round's first message: theta (fused NoLoCo) or D (split NoLoCo, DiLoCo).
    const codec::MessagePlan& message_plan() const { return plan_; }
    // D = theta - phi where the method sends it; before step() and before overlapped_start().
    void prepare(Replica& replica) const;
    // Overlapped rounds (engine/overlap.h): where the next inner phase starts while this round's
    // exchange runs, and the solo step's momentum, from the round's end `theta`.
    void overlapped_start(Replica& replica, std::span<const float> theta, std::span<float> start,
                          std::span<float> momentum);
    // The round's exchange and outer step over `link`, into the replica's phi and momentum. theta
    // is the round's end (a copy of it while the replica trains the next round); tokens are what
    // the member trained on in the round, said to its partners (0: not said).
    RoundOutcome step(RoundLink& link, Replica& replica, uint64_t round,
                      std::span<const float> theta, uint64_t tokens);

private:
    void noloco(RoundLink& link, Replica& replica, uint64_t round, std::span<const float> theta,
                uint64_t tokens, RoundOutcome& outcome);
    // The exchange with the partners: the values that arrived whole, each partner's into arenas
    // of its own.
    std::vector<MemberValues> exchange(RoundLink& link, Replica& replica, uint64_t round,
                                       std::span<const uint64_t> partners,
                                       std::span<const float> theta, uint64_t tokens,
                                       RoundOutcome& outcome);
    void diloco(RoundLink& link, Replica& replica, uint64_t round, uint64_t tokens,
                RoundOutcome& outcome);
    // `floats` each, grown to `count` (kept between rounds).
    static void ensure_arenas(std::vector<std::vector<float>>& arenas, size_t count, size_t floats);

    EngineConfig config_;
    size_t size_ = 0;
    // The second part's plan: phi (split NoLoCo), the update sample (fused NoLoCo with
    // [exchange].update_sample: theta and phi at the round's sampled coordinates), or none
    // (numel 0).
    codec::MessagePlan plan_, second_plan_;
    std::vector<std::vector<float>> received_, received_second_;  // NoLoCo: one per partner
    std::vector<uint64_t> sample_at_;           // fused NoLoCo: the round's sampled coordinates,
    std::vector<float> sample_;                 // this member's theta and phi there, as sent,
    std::vector<std::vector<float>> rounding_;  // and each partner's rounding bounds there
    std::vector<float> sent_;  // NoLoCo, judging: own theta or D as partners decode it
    std::vector<std::vector<float>> gathered_;  // DiLoCo: one per quorum member
    std::vector<float> scratch_a_, scratch_b_;
};

}  // namespace starling
