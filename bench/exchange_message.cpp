#include "bench/exchange_message.h"

#include "common/random.h"

namespace starling::bench {
DeltaModel::DeltaModel(const ModelConfig& config)
    : manifest(config),
      plan(codec::make_plan(manifest, codec::PlanKind::Delta, codec::Codec::Q8)),
      delta(manifest.total()) {
    for (size_t i = 0; i < delta.size(); ++i) delta[i] = static_cast<float>(1e-3 * normal_at(7, i));
}

const char* encoding_name(Encoding encoding) {
    return encoding == Encoding::WhileSending ? "end to end" : "transport only";
}

RoundMessages::RoundMessages(const DeltaModel& model, uint64_t self, uint64_t partner,
                             uint64_t round, Encoding encoding, std::vector<float>& received)
    : partner_(partner),
      round_(round),
      encoder_(model.plan, {self, round, 0}, model.delta.data(), nullptr, false),
      encoding_(encoding),
      decoder_(model.manifest.fingerprint(), model.manifest, received.data(), received.size()) {
    if (encoding == Encoding::Beforehand) {
        codec::EncodedMessage message = codec::encode_to_end(encoder_);
        header_ = std::move(message.header);
        for (std::vector<std::byte>& chunk : message.chunks)
            chunks_.push_back(std::make_shared<std::vector<std::byte>>(std::move(chunk)));
    }
}

ExchangeSlot RoundMessages::slot() {
    if (encoding_ == Encoding::WhileSending)
        return {round_, partner_, outgoing_message(encoder_), decoder_, {}, 0};
    OutgoingMessage handed_over{header_, [this](ChunkBuffer& out) {
                                    if (next_chunk_ == chunks_.size()) return false;
                                    out = chunks_[next_chunk_++];
                                    return true;
                                }};
    return {round_, partner_, std::move(handed_over), decoder_, {}, 0};
}

}  // namespace starling::bench
