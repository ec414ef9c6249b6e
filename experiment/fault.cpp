#include "experiment/fault.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <string>

#include "codec/codec.h"
#include "common/error.h"
#include "common/random.h"
#include "data/prepare.h"
#include "data/shard.h"
#include "optimizer/outer_round.h"

namespace starling {

namespace {

constexpr std::pair<FaultKind, std::string_view> kNames[] = {
    {FaultKind::None, "none"},
    {FaultKind::LearningRate, "learning_rate"},
    {FaultKind::WeightDecay, "weight_decay"},
    {FaultKind::NonFinite, "non_finite"},
    {FaultKind::Scaled, "scaled"},
    {FaultKind::SignFlip, "sign_flip"},
    {FaultKind::Noise, "noise"},
    {FaultKind::FreeRider, "free_rider"},
    {FaultKind::Replay, "replay"},
    {FaultKind::Bias, "bias"},
    {FaultKind::Tokens, "tokens"},
    {FaultKind::GarbageData, "garbage_data"},
    {FaultKind::Echo, "echo"},
};

double norm_of(std::span<const float> values) {
    double sum = 0.0;
    for (const float v : values) sum += static_cast<double>(v) * v;
    return std::sqrt(sum);
}

}  // namespace

std::string_view fault_kind_name(FaultKind kind) {
    for (const auto& [k, name] : kNames)
        if (k == kind) return name;
    return "?";
}

FaultKind fault_kind_from_name(std::string_view name) {
    std::string known;
    for (const auto& [kind, n] : kNames) {
        if (n == name) return kind;
        known += (known.empty() ? "" : ", ") + std::string(n);
    }
    throw Error("fault \"" + std::string(name) + "\" is not known (" + known + ")");
}

bool fault_alters_messages(FaultKind kind) {
    return kind != FaultKind::None && kind != FaultKind::LearningRate &&
           kind != FaultKind::WeightDecay && kind != FaultKind::GarbageData;
}

TrainConfig faulty_train_config(const FaultConfig& fault, TrainConfig train,
                                const std::string& garbage_dir) {
    if (fault.kind == FaultKind::LearningRate)
        train.schedule.max_lr = static_cast<float>(train.schedule.max_lr * fault.scale);
    if (fault.kind == FaultKind::WeightDecay)
        train.adamw.weight_decay = static_cast<float>(fault.scale);
    if (fault.kind == FaultKind::GarbageData) train.data.dir = garbage_dir;
    return train;
}

void write_garbage_data(const TrainConfig& train, const std::string& dir) {
    check_shards_tokenizer(train.data.dir, train.data.tokenizer);
    std::filesystem::create_directories(dir);
    const auto vocab = static_cast<uint64_t>(train.model.vocab_size);
    for (const char* split : {"train", "val"}) {
        size_t count = 0;
        for (const std::string& path : list_shards(train.data.dir, split))
            count += Shard(path).size();
        std::vector<uint16_t> tokens(count);
        const uint64_t seed = hash_index(train.seed, split[0]);
        for (size_t i = 0; i < count; i++)
            tokens[i] = static_cast<uint16_t>(hash_index(seed, i) % vocab);
        write_shard((std::filesystem::path(dir) / shard_file_name(split, 0)).string(), tokens);
    }
    const std::filesystem::path tokenizer = std::filesystem::path(dir) / kDataTokenizerFile;
    if (train.data.tokenizer.empty())
        std::filesystem::remove(tokenizer);
    else
        std::filesystem::copy_file(train.data.tokenizer, tokenizer,
                                   std::filesystem::copy_options::overwrite_existing);
}

FaultyLink::FaultyLink(std::unique_ptr<RoundLink> inner, const FaultConfig& fault,
                       const EngineConfig& config, const ParameterManifest& manifest,
                       uint64_t node_id, std::span<const float> phi, FaultMemory& memory,
                       PartnerMessage partner_message)
    : inner_(std::move(inner)),
      fault_(fault),
      zstd_(config.exchange.zstd),
      manifest_(manifest),
      node_id_(node_id),
      phi_(phi),
      memory_(memory),
      plans_(round_message_plans(config, manifest)),
      partner_message_(std::move(partner_message)) {}

std::vector<LinkExchanged> FaultyLink::exchange(uint64_t round, uint64_t partner,
                                                std::vector<LinkPart> parts, uint64_t bytes,
                                                uint64_t tokens) {
    // What part 0 carries, before its encoding: fused NoLoCo's update sample holds theta there.
    std::vector<float> theta;
    const bool sampled = plans_.second.kind == codec::PlanKind::Sample;
    for (uint32_t part = 0; part < parts.size(); part++) {
        const codec::EncodedMessage own = drained_message(parts[part].outgoing);
        std::shared_ptr<const codec::EncodedMessage> theirs;
        if (fault_.kind == FaultKind::Echo && partner_message_)
            theirs = partner_message_(round, partner, part);
        std::vector<float> values =
            theirs ? decoded(part, *theirs) : altered_values(round, part, own);
        // The faulty member's sample describes the theta it sends, as its own would: a sample
        // of another theta is refused by its rounding alone (optimizer/outer_round.h).
        if (sampled && part == 0) theta = values;
        if (sampled && part == 1 && !theta.empty()) {
            const size_t count = values.size() / 2;
            const std::vector<uint64_t> at = sample_coordinates(round, theta.size(), count);
            for (size_t j = 0; j < count; j++) values[j] = theta[at[j]];
            // A replay's sample describes the update it replays: the phi of the round before.
            if (fault_.kind == FaultKind::Replay) {
                if (memory_.phi.empty()) memory_.phi.assign(phi_.begin(), phi_.end());
                for (size_t j = 0; j < count; j++) values[count + j] = memory_.phi[at[j]];
                memory_.phi.assign(phi_.begin(), phi_.end());
            }
        }
        parts[part].outgoing = stored_message(encoded(round, part, values));
    }
    return inner_->exchange(round, partner, std::move(parts), bytes, said(tokens));
}

void FaultyLink::publish(uint64_t round, std::shared_ptr<const codec::EncodedMessage> message,
                         uint64_t tokens) {
    inner_->publish(round, encoded(round, 0, altered_values(round, 0, *message)), said(tokens));
}

uint64_t FaultyLink::said(uint64_t tokens) const {
    if (fault_.kind != FaultKind::Tokens) return tokens;
    return static_cast<uint64_t>(static_cast<double>(tokens) * fault_.scale);
}

std::vector<float> FaultyLink::decoded(uint32_t part, const codec::EncodedMessage& message) const {
    const size_t n = (part == 0 ? plans_.first : plans_.second).numel;
    std::vector<float> values(n);
    codec::MessageDecoder decoder(manifest_.fingerprint(), manifest_, values.data(), n);
    codec::decode_to_end(message.header, message.chunks, decoder);
    return values;
}

std::shared_ptr<const codec::EncodedMessage> FaultyLink::encoded(
    uint64_t round, uint32_t part, std::span<const float> values) const {
    const codec::MessagePlan& plan = part == 0 ? plans_.first : plans_.second;
    codec::MessageEncoder encoder(plan, {node_id_, round, part}, values.data(), nullptr, zstd_);
    return std::make_shared<const codec::EncodedMessage>(codec::encode_to_end(encoder));
}

std::vector<float> FaultyLink::altered_values(uint64_t round, uint32_t part,
                                              const codec::EncodedMessage& message) {
    std::vector<float> values = decoded(part, message);
    const size_t n = values.size();
    const codec::MessagePlan& plan = part == 0 ? plans_.first : plans_.second;
    if (fault_.kind == FaultKind::Replay) {
        if (memory_.last.size() <= part) memory_.last.resize(part + 1);
        // The first round has nothing older to send: its own values.
        if (memory_.last[part].empty()) memory_.last[part] = values;
        std::swap(values, memory_.last[part]);
    } else if (part == 0) {
        // Fused NoLoCo sends theta = phi + D; the others send D.
        const bool fused = plan.kind == codec::PlanKind::State;
        if (fused)
            for (size_t i = 0; i < n; i++) values[i] -= phi_[i];
        alter_update(round, plan, values);
        if (fused)
            for (size_t i = 0; i < n; i++) values[i] += phi_[i];
    }
    return values;
}

void FaultyLink::alter_update(uint64_t round, const codec::MessagePlan& plan,
                              std::span<float> d) const {
    const double norm = norm_of(d);
    switch (fault_.kind) {
        case FaultKind::NonFinite:
            // NaN where the codec carries fp32; elsewhere the largest values it takes.
            for (const codec::Segment& s : plan.segments)
                for (uint64_t i = s.offset; i < s.offset + s.numel; i++)
                    d[i] = s.codec == codec::Codec::F32 ? std::numeric_limits<float>::quiet_NaN()
                                                        : (i % 2 ? 3e38f : -3e38f);
            return;
        case FaultKind::Scaled:
            for (float& v : d) v = static_cast<float>(v * fault_.scale);
            return;
        case FaultKind::SignFlip:
            for (float& v : d) v = -v;
            return;
        case FaultKind::Noise: {
            const uint64_t seed = hash_index(node_id_, round);
            for (size_t i = 0; i < d.size(); i++) d[i] = static_cast<float>(normal_at(seed, i));
            const double scale = norm / std::max(norm_of(d), 1e-30);
            for (float& v : d) v = static_cast<float>(v * scale);
            return;
        }
        case FaultKind::FreeRider:
            for (float& v : d) v = 0.0f;
            return;
        case FaultKind::Bias: {
            // One direction for every round: the node's own.
            const uint64_t seed = node_id_;
            double u_norm = 0.0;
            for (size_t i = 0; i < d.size(); i++) u_norm += normal_at(seed, i) * normal_at(seed, i);
            const double step = fault_.scale * norm / std::sqrt(std::max(u_norm, 1e-30));
            for (size_t i = 0; i < d.size(); i++)
                d[i] = static_cast<float>(d[i] + step * normal_at(seed, i));
            return;
        }
        case FaultKind::None:
        case FaultKind::LearningRate:
        case FaultKind::WeightDecay:
        case FaultKind::Replay:
        case FaultKind::Tokens:
        case FaultKind::GarbageData:
        case FaultKind::Echo: return;
    }
}

}  // namespace starling
