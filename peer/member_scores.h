// What this node makes of each member's messages, and the quarantine that follows from it
// (docs/security.md): a member whose messages this node refuses twice in a row, or more than one
// in three for long, is not paired with for a while, growing with each quarantine, so a faulty
// member stops costing its partners their rounds. Judged by this node alone, from what it received:
// no member can quarantine another by saying so.
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

// Strikes: a refused message adds refusal_strikes (up to quarantine_strikes), an accepted one takes
// one off (not below 0), and a member whose strikes reach quarantine_strikes is quarantined. With 2
// and 4: two refusals in a row, or three of five messages that alternate (a member refused every
// other round, as a replay whose staleness shows in every other round): the strikes of a member
// refused more than one message in three grow, those of one refused now and then do not.
struct QuarantinePolicy {
    uint64_t refusal_strikes = 2;  // at most quarantine_strikes
    uint64_t quarantine_strikes = 4;
    // The first quarantine's length in this node's rounds; each further one is twice the last.
    uint64_t first_rounds = 8;
    uint64_t max_rounds = 1024;
};

struct MemberScore {
    uint64_t accepted = 0;           // messages that entered an outer step
    uint64_t refused = 0;            // messages refused: malformed, or failing the sanity checks
    uint64_t strikes = 0;            // QuarantinePolicy's
    uint64_t refused_lately = 0;     // refused since it last had no strikes
    uint64_t judged_lately = 0;      // judged (refused or accepted) since then
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

    // A message of `member` entered the outer step: takes a strike off.
    void accepted(uint64_t member);
    // A message of `member` for `round` was refused for `why`; the quarantine it starts, if any:
    // when its strikes reach `quarantine_strikes` and it is not quarantined in `round` already,
    // for first_rounds x 2^(quarantines so far) rounds from round + 1, at most max_rounds. A
    // quarantine leaves the strikes of one refusal, so the next refusal with no accepted message
    // between starts the next.
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
