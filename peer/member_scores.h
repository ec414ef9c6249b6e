// What this node makes of each member's messages, and the quarantine that follows from it
// (docs/security.md): a member whose messages this node refuses twice in a row is not paired
// with for a while, growing with each quarantine, so a faulty member stops costing its partners
// their rounds. Judged by this node alone, from what it received: no member can quarantine
// another by saying so.
//
// The counts are per member and kept while this process runs. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace starling {

struct QuarantinePolicy {
    // Refused messages in a row (no accepted one between) that quarantine a member the first time.
    uint64_t refusals_in_a_row = 2;
    // The first quarantine's length in this node's rounds; each further one is twice the last.
    uint64_t first_rounds = 8;
    uint64_t max_rounds = 1024;
};

struct MemberScore {
    uint64_t accepted = 0;           // messages that entered an outer step
    uint64_t refused = 0;            // messages refused: malformed, or failing the sanity checks
    uint64_t in_a_row = 0;           // refused since the last accepted one
    uint64_t quarantines = 0;        // times it was quarantined
    uint64_t quarantined_until = 0;  // the first round it may be paired with again; 0: never was
    std::string last_refusal;        // why its last refused message was refused
};

// A member this node has just quarantined.
struct Quarantine {
    uint64_t member = 0;
    uint64_t until_round = 0;  // first round it is paired with again
    uint64_t rounds = 0;
    const MemberScore score;
};

class MemberScores {
public:
    explicit MemberScores(QuarantinePolicy policy = {}) : policy_(policy) {}

    // A message of `member` entered the outer step: ends a run of refusals.
    void accepted(uint64_t member);
    // A message of `member` for `round` was refused for `why`; the quarantine it starts, if any:
    // when the refusals in a row reach `refusals_in_a_row` and the member is not quarantined in
    // `round` already (so after a quarantine, the next refusal with no accepted message between),
    // for first_rounds x 2^(quarantines so far) rounds from round + 1, at most max_rounds.
    std::optional<Quarantine> refused(uint64_t member, uint64_t round, std::string why);
    // Whether `member` is not to be paired with in `round`.
    bool quarantined(uint64_t member, uint64_t round) const;
    std::optional<MemberScore> score(uint64_t member) const;
    // The members quarantined in `round`.
    std::vector<uint64_t> quarantined_in(uint64_t round) const;

private:
    const QuarantinePolicy policy_;
    mutable Mutex mutex_;
    std::map<uint64_t, MemberScore> scores_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace starling
