// Faulty members for the study of robust rounds (docs/security.md): what a member with a broken
// config, a broken machine or bad intent sends. The simulation only: starlingd has no such code.
//
// Config faults change how the faulty replicas train (learning_rate: the rate times `scale`;
// weight_decay: the decay set to `scale`; garbage_data: shards of tokens drawn uniformly from the
// vocabulary, what a node whose data file is random bytes reads); their messages are then honest
// reports of a bad run.
// Message faults leave the faulty replica's own training and outer step alone and change what its
// link sends, through the real codec: the message is decoded, altered and encoded again, and the
// honest members receive it like any other; fused NoLoCo's update sample then holds the theta
// sent, as a faulty member's own sample would. With D the update the message carries (D itself in
// split NoLoCo and DiLoCo; theta - phi in fused NoLoCo, sent as phi + D):
//   non_finite  D = NaN in fp32 segments, +-3e38 elsewhere (what a codec lets through)
//   scaled      D = scale * D                    sign_flip  D = -D
//   noise       D = Gaussian noise of D's norm   free_rider D = 0 (its phi, as if it trained not)
//   replay      the message it sent the round before (the first round: its own), its update
//               sample drawn at this round's coordinates from that round's theta and phi
//   bias        D = D + scale * |D| * u, u one fixed unit direction for every round
//   tokens      the tokens it says it trained on, times scale
//   echo        (NoLoCo) its partner's own message, sent back as its own: it takes the partner's
//               values and gives nothing (its own message where the partner is faulty too)
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/config.h"
#include "engine/member_round.h"
#include "model/manifest.h"
#include "engine/round_link.h"

namespace starling {

enum class FaultKind {
    None,
    LearningRate,
    WeightDecay,
    NonFinite,
    Scaled,
    SignFlip,
    Noise,
    FreeRider,
    Replay,
    Bias,
    Tokens,
    GarbageData,
    Echo,
};

std::string_view fault_kind_name(FaultKind kind);       // "none", "learning_rate", ...
FaultKind fault_kind_from_name(std::string_view name);  // throws starling::Error when unknown
// Whether the fault changes what the link sends (else it changes training, or nothing).
bool fault_alters_messages(FaultKind kind);

struct FaultConfig {
    FaultKind kind = FaultKind::None;
    int members = 1;  // the last `members` replicas are faulty
    double scale = 100.0;
};

// The train config of a faulty replica under a config fault; `train` itself otherwise. A
// garbage_data fault reads `garbage_dir`, which write_garbage_data fills.
TrainConfig faulty_train_config(const FaultConfig& fault, TrainConfig train,
                                const std::string& garbage_dir = {});

// Writes into `dir` as many uniformly random tokens as train.data.dir's train and val shards hold
// (and its tokenizer file, so the shards pass the same check), drawn from train.seed.
void write_garbage_data(const TrainConfig& train, const std::string& dir);

// What a faulty replica's links remember from round to round: the values of each part it sent
// last and, with fused NoLoCo's update sample, the phi it sent them from (for a replay).
struct FaultMemory {
    std::vector<std::vector<float>> last;
    std::vector<float> phi;
};

// What an echoing member reads before it answers: the message `partner` sends it as part `part`
// of `round`, once sent; nullptr where the partner is faulty too (two echoes would wait for each
// other) or left the round.
using PartnerMessage = std::function<std::shared_ptr<const codec::EncodedMessage>(
    uint64_t round, uint64_t partner, uint32_t part)>;

// A faulty member's link: `inner` with its outgoing messages (and said tokens) altered by the
// fault. phi: the member's, as its messages of the round start from (fused ones are phi + D);
// it, the manifest and the memory must outlive the link. An echo reads its partners' messages
// through partner_message.
class FaultyLink : public RoundLink {
public:
    FaultyLink(std::unique_ptr<RoundLink> inner, const FaultConfig& fault,
               const EngineConfig& config, const ParameterManifest& manifest, uint64_t node_id,
               std::span<const float> phi, FaultMemory& memory,
               PartnerMessage partner_message = {});

    std::vector<uint64_t> partners(uint64_t round) override { return inner_->partners(round); }
    std::vector<LinkExchanged> exchange(uint64_t round, uint64_t partner,
                                        std::vector<LinkPart> parts, uint64_t bytes,
                                        uint64_t tokens) override;
    void judged(uint64_t member, uint64_t round,
                const std::optional<std::string>& refusal) override {
        inner_->judged(member, round, refusal);
    }
    std::vector<uint64_t> quorum(uint64_t round) override { return inner_->quorum(round); }
    void publish(uint64_t round, std::shared_ptr<const codec::EncodedMessage> message,
                 uint64_t tokens) override;
    std::vector<LinkGathered> gather(uint64_t round, std::span<const uint64_t> members,
                                     std::span<codec::MessageDecoder* const> decoders,
                                     uint64_t* bytes) override {
        return inner_->gather(round, members, decoders, bytes);
    }

private:
    // The values of `part` as the fault makes them, before their encoding.
    std::vector<float> altered_values(uint64_t round, uint32_t part,
                                      const codec::EncodedMessage& message);
    // `message`'s values, decoded whole.
    std::vector<float> decoded(uint32_t part, const codec::EncodedMessage& message) const;
    // `values` encoded as this member's message of `part`.
    std::shared_ptr<const codec::EncodedMessage> encoded(uint64_t round, uint32_t part,
                                                         std::span<const float> values) const;
    // What the fault does to an update D encoded under `plan`.
    void alter_update(uint64_t round, const codec::MessagePlan& plan, std::span<float> d) const;
    uint64_t said(uint64_t tokens) const;

    std::unique_ptr<RoundLink> inner_;
    const FaultConfig fault_;
    const bool zstd_;
    const ParameterManifest& manifest_;
    const uint64_t node_id_;
    const std::span<const float> phi_;
    FaultMemory& memory_;
    RoundPlans plans_;
    PartnerMessage partner_message_;
};

}  // namespace starling
