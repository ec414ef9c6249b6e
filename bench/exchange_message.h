// What the exchange benchmark sends: a Q8 delta of a model (configs/124m.toml by default), its
// values normal with std 1e-3 like the change of a few hundred steps, and where the partner's
// lands.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "model/manifest.h"
#include "codec/message.h"
#include "peer/exchange.h"

namespace starling::bench {

// The model's manifest, the Q8 delta plan over it and a delta-like arena.
struct DeltaModel {
    explicit DeltaModel(const ModelConfig& config);
    ParameterManifest manifest;
    codec::MessagePlan plan;
    std::vector<float> delta;
};

enum class Encoding {
    WhileSending,  // end to end: the encoder produces each chunk as the stream asks for it
    Beforehand,    // transport only: chunks encoded before the clock starts, handed over one by one
};

const char* encoding_name(Encoding encoding);  // "end to end", "transport only"

// One round's messages on one node: our message for the partner and the decoder for theirs,
// built before the clock starts. Both carry the round and the sender, which the exchange checks.
class RoundMessages {
public:
    RoundMessages(const DeltaModel& model, uint64_t self, uint64_t partner, uint64_t round,
                  Encoding encoding, std::vector<float>& received);
    RoundMessages(const RoundMessages&) = delete;
    RoundMessages& operator=(const RoundMessages&) = delete;

    // The slot for RoundPeers::exchange; take it once.
    ExchangeSlot slot();

private:
    uint64_t partner_;
    uint64_t round_;
    codec::MessageEncoder encoder_;
    std::vector<std::byte> header_;  // Beforehand: the message, handed to the stream chunk by chunk
    std::vector<ChunkBuffer> chunks_;
    size_t next_chunk_ = 0;
    Encoding encoding_;
    codec::MessageDecoder decoder_;
};

}  // namespace starling::bench
