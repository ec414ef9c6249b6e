// The engine's configuration: what trains one replica (TrainConfig: model, batch, schedule, AdamW,
// data, device) and what joins replicas (EngineConfig: the outer method, H, the outer step and the
// exchange's codecs). `starling train`, the experiment's replicas and a swarm node all read these
// from one TOML file (see configs/); every option has a default that works on a laptop.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "codec/codec.h"
#include "codec/sparse.h"
#include "model/config.h"
#include "optimizer/adamw.h"
#include "optimizer/outer_round.h"
#include "optimizer/schedule.h"

namespace starling {

struct DataConfig {
    std::string dir = "out/kjv";   // holds train_*.bin and val_*.bin from `starling data prepare`
    std::string tokenizer;         // the tokenizer.json the shards were made with; empty: bytes
    uint64_t node_id = 0;          // seeds this node's order through the data
    uint32_t partition_index = 0;  // disjoint subsets for replicas of one experiment
    uint32_t partition_count = 1;
};

struct TrainConfig {
    ModelConfig model;
    int batch_size = 8;
    int seq_len = 0;  // 0: the model's context
    int64_t steps = 1000;
    uint64_t seed = 1;
    int threads = 0;              // 0: all cores
    std::string device = "auto";  // "auto", "cpu", "cuda", "cuda:N", "cuda:N,M,..." or "cuda:all"
                                  // (kernels/backend.h)
    std::string matmul = "fp32";  // on a GPU: "fp32", "tf32" or "bf16" (kernels/cuda/cuda_ops.h)
    LrSchedule schedule;          // total_steps is taken from steps, see lr_schedule()
    AdamWConfig adamw;
    DataConfig data;
    int log_every = 50;
    int eval_every = 250;  // 0: only at the end
    int eval_batches = 16;
    std::string run_dir = "out/runs/default";
    int checkpoint_every = 0;  // 0: only at the end
    int keep_checkpoints = 3;
    bool resume = true;  // continue from the newest checkpoint in run_dir when there is one

    int effective_seq_len() const { return seq_len > 0 ? seq_len : model.context; }
    LrSchedule lr_schedule() const {
        LrSchedule s = schedule;
        s.total_steps = steps;
        return s;
    }
    // Throws starling::Error naming the key. Reads [data].tokenizer when set, which must fit the
    // model: [model].vocab_size at least its vocabulary.
    void validate() const;
};

// How replicas are joined every H inner steps (docs/spec.md sections 4 and 7.3).
enum class OuterMethod : uint8_t {
    Ddp,     // gradient averaging every step: the experiment's reference, not a swarm's
    Local,   // no communication at all: phi = theta after every inner phase
    DiLoCo,  // all-gather of delta messages over the live quorum every H steps
    NoLoCo,  // groups (pairs) every H steps, chosen by peer/partners.h
};
std::string_view outer_method_name(OuterMethod method);  // "ddp", "local", "diloco", "noloco"
// Throws starling::Error naming the known methods.
OuterMethod outer_method_from_name(std::string_view name);

struct ExchangeConfig {
    MessageMode mode = MessageMode::Fused;
    codec::Codec state_codec = codec::Codec::BF16SR;  // theta (fused) or phi (split)
    codec::Codec delta_codec = codec::Codec::Q8;      // D (split NoLoCo, DiLoCo)
    bool error_feedback = true;                       // on the delta messages
    bool zstd = true;
    // TOPK's format (codec/sparse.h) and how much of its residual a round keeps. 3% (108x smaller
    // than fp32 with 2-bit values): the densest the study measured, within 1% of Q8's loss in
    // DiLoCo where 1.5% was 7% behind (docs/compression.md).
    uint32_t topk_chunk = 4096;
    double topk_density = 0.03;
    uint32_t topk_value_bits = 2;
    double feedback_decay = 0.95;
    // DiLoCo with TOPK: a member restarts each round from phi plus what its own message left
    // unsent, rather than from phi with the remainder carried into its next message
    // (docs/compression.md: +0.2% of Q8's loss at H 10 where the carried remainder costs +5%).
    bool residual_in_weights = true;
    // Split NoLoCo: phi goes with D every this many rounds (those whose number it divides), D
    // alone in the others, which take no pull. Phi is as large as the weights and does not
    // sparsify, so with TOPK D it is nearly the whole message (docs/compression.md).
    uint32_t phi_every = 1;
    // Fused NoLoCo: theta and phi at this many coordinates drawn from the round go beside theta
    // (fp32, 8 bytes a coordinate), so that a partner reads the update theta - phi there exactly,
    // apart from the drift between the two phis and the state codec's rounding, and judges it as a
    // split D (optimizer/outer_round.h, docs/security.md); 0: none. 64 KB a message: 26.5% of a
    // pico model's BF16SR theta, 0.03% of a 124M one's.
    uint32_t update_sample = 8192;

    // Throws starling::Error naming the problem where the topk keys make no format.
    codec::SparseFormat topk_format() const;
    // Whether round `round`'s messages carry phi: split mode, every phi_every-th round.
    bool carries_phi(uint64_t round) const;
    // What the delta messages' encoder decays the residual by: feedback_decay with TOPK, else 1.
    float delta_feedback_decay() const;
};

// The most inner steps of a TOPK DiLoCo round the study found to train well
// (docs/compression.md): at H 10 within 1% of Q8 at H 10, at H 50 15% behind with the residual in
// the messages and 54% with it in the weights, for phi gains only a few percent of each chunk a
// round and 20 rounds leave it far behind the replicas. EngineConfig::settings_warning names
// longer rounds.
inline constexpr int kMaxSparseInnerSteps = 10;
// One replica and how it is joined to others; ExperimentConfig and SwarmConfig extend it.
struct EngineConfig {
    // The replica: model, batch, steps (its inner steps: the token budget and the schedule's
    // length), seed (every replica's initialisation), threads, device, schedule, AdamW, data.
    TrainConfig train;
    OuterMethod method = OuterMethod::NoLoCo;
    int inner_steps = 50;  // H: inner steps per round
    OuterConfig outer;
    // Fused: theta under state_codec. Split: D = theta - phi under delta_codec (error feedback
    // when set) and phi under state_codec.
    ExchangeConfig exchange;
    // The outer step judges the others' messages (optimizer/outer_round.h: sane(), direction,
    // clip, token caps; the link's quarantine follows the refusals). Always on in starlingd; the
    // experiment's [fault].defences turns it off to measure what the defences save.
    bool judge_messages = true;

    // Whether a DiLoCo member keeps its residual in its weights: DiLoCo, TOPK deltas with error
    // feedback and exchange.residual_in_weights. Its messages then carry D alone (the residual is
    // already in theta), its residual becomes D minus what it sent, and each round restarts from
    // theta = phi + residual (Replica::restart_from_phi). Not split NoLoCo: there it cost 17% of
    // the final loss against the residual in the messages (docs/compression.md).
    bool residual_in_weights() const;
    // What the delta messages' encoder decays the residual by: 0 where the residual lives in the
    // weights, else exchange.delta_feedback_decay().
    float delta_feedback_decay() const;
    // What valid settings train poorly, for a warning at start; empty where nothing does. TOPK
    // DiLoCo rounds of more than kMaxSparseInnerSteps inner steps: phi takes a few percent of
    // each chunk a round, too few rounds to follow the replicas (docs/compression.md).
    std::string settings_warning() const;

    // Throws starling::Error naming the key: the training config, H, the outer step, fused
    // NoLoCo's pull, and codecs in their roles.
    void validate() const;
};

}  // namespace starling
