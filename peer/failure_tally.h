// What went wrong on a node since it started, counted by reason, for starlingd's
// starling_failures_total{reason}. Each layer keeps its own tally: the PeerNode counts what
// happens in the peer layer (refused calls, deadlines, malformed or mismatched messages), the
// daemon's NodeState what the round loop meets (messages the outer step refused, failed state
// copies and checkpoints); /metrics shows their sum.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <string_view>

namespace starling {

enum class FailureReason {
    Auth,  // a call refused for failed authentication, either way (wrong secret, bad or missing
           // credentials)
    Connection,      // a connection to the peer port closed before any call on it authenticated:
                     // over a cap on such connections, or out of time
    Timeout,         // an exchange, a pairing call or a round-message fetch cut off by its deadline
    RefusedMessage,  // a partner's message refused: malformed, mismatched or failing the outer
                     // step's sanity checks
    StateSync,       // a state copy from the swarm that failed
    Checkpoint,      // a checkpoint that could not be written
};

inline constexpr std::array kFailureReasons{FailureReason::Auth,      FailureReason::Connection,
                                            FailureReason::Timeout,   FailureReason::RefusedMessage,
                                            FailureReason::StateSync, FailureReason::Checkpoint};

// The label value: "auth", "connection", "timeout", "refused_message", "state_sync", "checkpoint".
constexpr std::string_view failure_reason_name(FailureReason reason) {
    switch (reason) {
        case FailureReason::Auth: return "auth";
        case FailureReason::Connection: return "connection";
        case FailureReason::Timeout: return "timeout";
        case FailureReason::RefusedMessage: return "refused_message";
        case FailureReason::StateSync: return "state_sync";
        case FailureReason::Checkpoint: return "checkpoint";
    }
    return "unknown";
}

// Running totals, by reason (indexed as kFailureReasons).
using FailureCounts = std::array<uint64_t, kFailureReasons.size()>;

// Thread-safe: any thread counts, any thread reads.
class FailureTally {
public:
    void count(FailureReason reason, uint64_t times = 1) {
        counts_[static_cast<size_t>(reason)].fetch_add(times, std::memory_order_relaxed);
    }
    FailureCounts totals() const {
        FailureCounts totals{};
        for (size_t i = 0; i < totals.size(); i++)
            totals[i] = counts_[i].load(std::memory_order_relaxed);
        return totals;
    }

private:
    std::array<std::atomic<uint64_t>, kFailureReasons.size()> counts_{};
};

}  // namespace starling
