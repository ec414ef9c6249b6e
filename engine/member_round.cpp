#include "engine/member_round.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fmt/format.h>

#include "codec/codec.h"
#include "common/error.h"
#include "engine/overlap.h"
#include "optimizer/outer_round.h"

namespace starling {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

// RMS of a - b: how far two replicas have drifted apart.
double rms_distance(std::span<const float> a, std::span<const float> b) {
    double sum = 0.0;
    for (size_t i = 0; i < a.size(); i++) {
        const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
        sum += d * d;
    }
    return a.empty() ? 0.0 : std::sqrt(sum / static_cast<double>(a.size()));
}

// The encoder's message as it streams out, each chunk also decoded into `own`: what the partner
// decodes of it, without holding the whole message.
LinkMessage streamed_and_kept(codec::MessageEncoder& encoder, codec::MessageDecoder& own) {
    return {encoder.header_bytes(), [&encoder, &own](std::vector<std::byte>& out) {
                if (!encoder.next_chunk(out)) return false;
                own.accept_chunk(out);
                return true;
            }};
}

void add_failure(RoundOutcome& outcome, const std::string& why) {
    outcome.failure += (outcome.failure.empty() ? "" : "; ") + why;
}

}  // namespace

LinkMessage streamed_message(codec::MessageEncoder& encoder) {
    return {encoder.header_bytes(),
            [&encoder](std::vector<std::byte>& out) { return encoder.next_chunk(out); }};
}

LinkMessage stored_message(std::shared_ptr<const codec::EncodedMessage> message) {
    std::vector<std::byte> header = message->header;
    return {std::move(header),
            [message = std::move(message), next = size_t{0}](std::vector<std::byte>& out) mutable {
                if (next == message->chunks.size()) return false;
                out = message->chunks[next++];
                return true;
            }};
}

RoundPlans round_message_plans(const EngineConfig& config, const ParameterManifest& manifest) {
    const bool split =
        config.exchange.mode == MessageMode::Split && config.method == OuterMethod::NoLoCo;
    RoundPlans plans;
    plans.first =
        split || config.method == OuterMethod::DiLoCo
            ? codec::make_plan(manifest, codec::PlanKind::Delta, config.exchange.delta_codec,
                               config.exchange.topk_format())
            : codec::make_plan(manifest, codec::PlanKind::State, config.exchange.state_codec);
    if (split)
        plans.second =
            codec::make_plan(manifest, codec::PlanKind::State, config.exchange.state_codec);
    else if (config.method == OuterMethod::NoLoCo && config.exchange.update_sample > 0)
        plans.second = codec::sample_plan(
            manifest, 2 * std::min<uint64_t>(config.exchange.update_sample, manifest.total()));
    return plans;
}

codec::EncodedMessage drained_message(LinkMessage& message) {
    codec::EncodedMessage whole{std::move(message.header), {}};
    std::vector<std::byte> chunk;
    while (message.next_chunk(chunk)) whole.chunks.push_back(chunk);
    return whole;
}

MemberRound::MemberRound(const EngineConfig& config, const ParameterManifest& manifest)
    : config_(config), size_(manifest.total()) {
    RoundPlans plans = round_message_plans(config_, manifest);
    plan_ = std::move(plans.first);
    second_plan_ = std::move(plans.second);
    scratch_a_.resize(size_);
    scratch_b_.resize(size_);
}

void MemberRound::prepare(Replica& replica) const {
    if (config_.method == OuterMethod::DiLoCo || config_.exchange.mode == MessageMode::Split)
        replica.compute_displacement();
}

void MemberRound::overlapped_start(Replica& replica, std::span<const float> theta,
                                   std::span<float> start, std::span<float> momentum) {
    solo_outer_start(config_, replica, theta, start, momentum, scratch_a_, scratch_b_);
}

RoundOutcome MemberRound::step(RoundLink& link, Replica& replica, uint64_t round,
                               std::span<const float> theta, uint64_t tokens) {
    RoundOutcome outcome;
    switch (config_.method) {
        case OuterMethod::DiLoCo: diloco(link, replica, round, tokens, outcome); return outcome;
        case OuterMethod::NoLoCo:
            noloco(link, replica, round, theta, tokens, outcome);
            return outcome;
        case OuterMethod::Local:
        case OuterMethod::Ddp: break;
    }
    throw Error("member round: method \"" + std::string(outer_method_name(config_.method)) +
                "\" exchanges nothing (noloco or diloco do)");
}

void MemberRound::ensure_arenas(std::vector<std::vector<float>>& arenas, size_t count,
                                size_t floats) {
    if (arenas.size() < count) arenas.resize(count);
    for (auto& arena : arenas) arena.resize(floats);
}

void MemberRound::noloco(RoundLink& link, Replica& replica, uint64_t round,
                         std::span<const float> theta, uint64_t tokens, RoundOutcome& outcome) {
    const auto start = Clock::now();
    const std::vector<uint64_t> partners = link.partners(round);
    outcome.pair_seconds = seconds_since(start);
    std::vector<MemberValues> arrived;
    sent_.clear();
    sample_at_.clear();
    if (!partners.empty() && second_plan_.kind == codec::PlanKind::Sample)
        sample_at_ = sample_coordinates(round, size_, second_plan_.numel / 2);
    if (!partners.empty()) {
        outcome.partner = partners.front();
        const auto exchange_start = Clock::now();
        arrived = exchange(link, replica, round, partners, theta, tokens, outcome);
        outcome.exchange_seconds = seconds_since(exchange_start);
    }
    const bool split = config_.exchange.mode == MessageMode::Split;
    MemberValues own{
        .node_id = replica.node_id(),
        .values = split ? replica.displacement() : theta,
        .phi = split ? std::span<const float>(replica.phi()) : std::span<const float>(),
        .sent = sent_};
    // Each member counts as the tokens it trained on, when every one said them; exchange() left
    // each partner's claim in its weight.
    const bool weighted = tokens > 0 && !arrived.empty() &&
                          std::all_of(arrived.begin(), arrived.end(),
                                      [](const MemberValues& p) { return p.weight > 0.0; });
    if (weighted) {
        own.weight = static_cast<double>(tokens);
    } else {
        for (MemberValues& p : arrived) p.weight = 1.0;
    }
    replica.partner_checks().judge = config_.judge_messages;
    replica.partner_checks().judge_alignment = config_.exchange.delta_codec != codec::Codec::TOPK;
    replica.partner_checks().sample_at = sample_at_;
    replica.partner_checks().held_out_loss = nullptr;
    if (config_.judge_messages && replica.held_out_available())
        replica.partner_checks().held_out_loss = [&replica](std::span<const float> weights) {
            return replica.held_out_loss(weights);
        };
    const NoLoCoStep step = noloco_outer_step(config_.outer, config_.exchange.mode, own, arrived,
                                              replica.partner_checks(), replica.phi(),
                                              replica.momentum(), scratch_a_, scratch_b_);
    outcome.members = step.members;
    outcome.solo = step.members < 2;
    if (!arrived.empty() && outcome.partner == arrived.front().node_id &&
        !std::isnan(step.held_out_ratios.front()))
        outcome.partner_held_out = step.held_out_ratios.front();
    for (const Refusal& refusal : step.refused) {
        add_failure(outcome, refusal.why);
        outcome.refused++;
    }
    for (const MemberValues& p : arrived) {
        const auto refusal = std::find_if(step.refused.begin(), step.refused.end(),
                                          [&](const Refusal& r) { return r.member == p.node_id; });
        if (refusal != step.refused.end() && refusal->own_fault) continue;
        link.judged(p.node_id, round,
                    refusal == step.refused.end() ? std::nullopt
                                                  : std::optional<std::string>(refusal->why));
    }
}

std::vector<MemberValues> MemberRound::exchange(RoundLink& link, Replica& replica, uint64_t round,
                                                std::span<const uint64_t> partners,
                                                std::span<const float> theta, uint64_t tokens,
                                                RoundOutcome& outcome) {
    const bool split = config_.exchange.mode == MessageMode::Split;
    const bool sampled = second_plan_.kind == codec::PlanKind::Sample;
    const bool with_second = sampled || config_.exchange.carries_phi(round);
    const ParameterManifest& manifest = replica.manifest();
    const uint64_t id = replica.node_id();
    const uint64_t bytes =
        codec::payload_bytes(plan_) + (with_second ? codec::payload_bytes(second_plan_) : 0);
    // Part 0: theta (fused), or D with error feedback when configured (split); part 1: phi, in
    // the rounds that carry it (split), or theta and then phi at the round's sampled coordinates
    // (fused), exactly.
    float* residual =
        split && config_.exchange.error_feedback ? replica.residual().data() : nullptr;
    codec::MessageEncoder first(
        plan_, {id, round, 0}, split ? replica.displacement().data() : theta.data(), residual,
        config_.exchange.zstd, split ? config_.delta_feedback_decay() : 1.0f);
    if (sampled) {
        sample_.clear();
        for (const uint64_t i : sample_at_) sample_.push_back(theta[i]);
        for (const uint64_t i : sample_at_) sample_.push_back(replica.phi()[i]);
    }
    std::optional<codec::MessageEncoder> second;
    if (with_second)
        second.emplace(second_plan_, codec::RoundingKey{id, round, 1},
                       sampled ? sample_.data() : replica.phi().data(), nullptr,
                       config_.exchange.zstd);
    // One partner's messages stream from the encoders as they go out; several partners get the
    // same messages, encoded once (error feedback updates the residual once).
    std::shared_ptr<const codec::EncodedMessage> first_whole, second_whole;
    if (partners.size() > 1) {
        first_whole = std::make_shared<const codec::EncodedMessage>(codec::encode_to_end(first));
        if (with_second)
            second_whole =
                std::make_shared<const codec::EncodedMessage>(codec::encode_to_end(*second));
    }
    // What its partners decode of this node's first message, decoded as it goes out: a partner's
    // values that close are an echo, and the held-out check scores this node's weights as its
    // partners will see them (phi + its D decoded), as it scores theirs: a sparse D leaves most
    // of the round's training out of both.
    std::optional<codec::MessageDecoder> own_in;
    if (config_.judge_messages) {
        sent_.resize(size_);
        own_in.emplace(manifest.fingerprint(), manifest, sent_.data(), size_);
        if (first_whole)
            codec::decode_to_end(first_whole->header, first_whole->chunks, *own_in);
        else
            own_in->accept_header(first.header_bytes());
    }
    ensure_arenas(received_, partners.size(), size_);
    if (with_second) ensure_arenas(received_second_, partners.size(), second_plan_.numel);
    if (sampled) ensure_arenas(rounding_, partners.size(), sample_at_.size());

    std::vector<MemberValues> arrived;
    for (size_t k = 0; k < partners.size(); k++) {
        codec::MessageDecoder first_in(manifest.fingerprint(), manifest, received_[k].data(),
                                       size_);
        std::optional<codec::MessageDecoder> second_in;
        std::vector<LinkPart> parts;
        parts.push_back({first_whole ? stored_message(first_whole)
                         : own_in    ? streamed_and_kept(first, *own_in)
                                     : streamed_message(first),
                         first_in});
        if (with_second) {
            second_in.emplace(manifest.fingerprint(), manifest, received_second_[k].data(),
                              second_plan_.numel);
            parts.push_back(
                {second_whole ? stored_message(second_whole) : streamed_message(*second),
                 *second_in});
        }
        bool received = true;
        uint64_t said = 0;
        for (const LinkExchanged& r :
             link.exchange(round, partners[k], std::move(parts), bytes, tokens)) {
            outcome.bytes_sent += r.bytes_sent;
            outcome.bytes_received += r.bytes_received;
            said = r.partner_tokens;
            if (!r.received) {
                received = false;
                add_failure(outcome, r.error);
            }
        }
        if (k == 0) outcome.partner_tokens = said;
        if (!received) continue;
        MemberValues partner{
            .node_id = partners[k], .values = received_[k], .weight = static_cast<double>(said)};
        if (sampled) {
            // Theta then phi at the sampled coordinates, and how far the decoded theta there may
            // lie from the exact one by the codec's rounding, under the plan its header named.
            const std::span<const float> sample(received_second_[k]);
            partner.sample_theta = sample.first(sample_at_.size());
            partner.sample_phi = sample.last(sample_at_.size());
            rounding_[k] = codec::rounding_bounds(first_in.plan(), received_[k], sample_at_);
            partner.sample_rounding = rounding_[k];
        } else if (with_second) {
            partner.phi = received_second_[k];
        }
        arrived.push_back(partner);
        if (k == 0) {
            // The partner's theta: as sent (fused), or phi + D (split; this member's phi where
            // the round carries none), next to this member's.
            std::span<const float> theirs = received_[k];
            if (split) {
                const std::span<const float> phi =
                    with_second ? std::span<const float>(received_second_[k]) : replica.phi();
                for (size_t i = 0; i < size_; i++) scratch_a_[i] = phi[i] + received_[k][i];
                theirs = scratch_a_;
            }
            outcome.partner_distance = rms_distance(theta, theirs);
        }
    }
    // A message cut off on its way was not all sent: nothing to tell an echo by.
    if (own_in && !own_in->complete()) sent_.clear();
    return arrived;
}

void MemberRound::diloco(RoundLink& link, Replica& replica, uint64_t round, uint64_t tokens,
                         RoundOutcome& outcome) {
    const auto start = Clock::now();
    const uint64_t id = replica.node_id();
    float* residual = config_.exchange.error_feedback ? replica.residual().data() : nullptr;
    codec::MessageEncoder encoder(plan_, {id, round, 0}, replica.displacement().data(), residual,
                                  config_.exchange.zstd, config_.delta_feedback_decay());
    const auto own = std::make_shared<const codec::EncodedMessage>(codec::encode_to_end(encoder));
    link.publish(round, own, tokens);

    std::vector<uint64_t> quorum = link.quorum(round);
    if (std::find(quorum.begin(), quorum.end(), id) == quorum.end()) quorum.push_back(id);
    std::sort(quorum.begin(), quorum.end());
    const ParameterManifest& manifest = replica.manifest();
    ensure_arenas(gathered_, quorum.size(), size_);
    std::vector<std::unique_ptr<codec::MessageDecoder>> decoders;
    for (size_t i = 0; i < quorum.size(); i++)
        decoders.push_back(std::make_unique<codec::MessageDecoder>(manifest.fingerprint(), manifest,
                                                                   gathered_[i].data(), size_));
    std::vector<uint64_t> others;
    std::vector<codec::MessageDecoder*> other_decoders;
    size_t own_index = 0;
    for (size_t i = 0; i < quorum.size(); i++) {
        if (quorum[i] == id) {
            own_index = i;
            continue;
        }
        others.push_back(quorum[i]);
        other_decoders.push_back(decoders[i].get());
    }
    // Its own D as the others decode it, so every member averages the same values.
    codec::decode_to_end(own->header, own->chunks, *decoders[own_index]);
    const std::vector<LinkGathered> fetched =
        link.gather(round, others, other_decoders, &outcome.bytes_received);

    // In node-id order, with the tokens each member said it trained on: the weights when every
    // member said them.
    std::vector<std::span<const float>> decoded;
    std::vector<double> weights;
    std::vector<uint64_t> authors;
    for (size_t i = 0, k = 0; i < quorum.size(); i++) {
        uint64_t said = tokens;
        if (i != own_index) {
            const LinkGathered& g = fetched[k++];
            if (!g.error.empty()) continue;
            said = g.tokens;
        }
        decoded.push_back(std::span<const float>(gathered_[i].data(), size_));
        weights.push_back(static_cast<double>(said));
        authors.push_back(quorum[i]);
    }
    if (std::find(weights.begin(), weights.end(), 0.0) != weights.end()) weights.clear();
    for (const LinkGathered& g : fetched)
        if (!g.error.empty()) add_failure(outcome, g.error);
    outcome.bytes_sent = own->bytes() * others.size();
    outcome.quorum = decoded.size();
    outcome.solo = decoded.size() < 2;
    outcome.exchange_seconds = seconds_since(start);
    const DiLoCoStep step =
        diloco_outer_step(config_.outer, decoded, replica.phi(), replica.momentum(), scratch_a_,
                          weights, config_.judge_messages);
    outcome.members = step.members;
    std::vector<std::optional<std::string>> refusals(authors.size());
    for (const size_t k : step.not_finite)
        refusals[k] = fmt::format("member {:016x}: its D is not finite, left out", authors[k]);
    for (const size_t k : step.too_large)
        refusals[k] =
            fmt::format("member {:016x}: its D is more than {} times the norm allowed it, left out",
                        authors[k], kFarAboveAllowed);
    for (const size_t k : step.off_course)
        refusals[k] = fmt::format(
            "member {:016x}: its D points away from the others', left out (cosine with their "
            "sum {:.3f}, below {} times the median member's {:.3f})",
            authors[k], step.cosines[k], kMinCosineOfMedian, step.median_cosine);
    for (const size_t k : step.stale)
        refusals[k] = fmt::format(
            "member {:016x}: its D points the last outer step's way more than the others' do, "
            "left out as a round old (its cosine with the momentum less that with their sum "
            "{:.3f}, above the median member's {:.3f} by more than {})",
            authors[k], step.staleness[k], step.median_staleness, kStaleMargin);
    // Every member leaves out the same D's; the judgements name the member that sent them (a
    // quarantine here names it and stops pairing with it, while the quorum still gathers its D
    // so that every member averages the same ones).
    for (size_t k = 0; k < authors.size(); k++) {
        if (refusals[k]) {
            add_failure(outcome, *refusals[k]);
            outcome.refused++;
        }
        if (authors[k] != replica.node_id()) link.judged(authors[k], round, refusals[k]);
    }
}

}  // namespace starling
