#include "peer/member_scores.h"

#include <algorithm>

namespace starling {

void MemberScores::accepted(uint64_t member) {
    MutexLock lock(mutex_);
    MemberScore& s = scores_[member];
    s.accepted++;
    if (s.strikes > 0) s.strikes--;
    s.judged_lately = s.strikes > 0 ? s.judged_lately + 1 : 0;
    s.refused_lately = s.strikes > 0 ? s.refused_lately : 0;
}

std::optional<Quarantine> MemberScores::refused(uint64_t member, uint64_t round, std::string why) {
    MutexLock lock(mutex_);
    MemberScore& s = scores_[member];
    s.refused++;
    s.refused_lately++;
    s.judged_lately++;
    s.strikes = std::min(s.strikes + policy_.refusal_strikes, policy_.quarantine_strikes);
    s.last_refusal = std::move(why);
    // A member already quarantined (a message of a round paired before the quarantine began, or
    // a DiLoCo D, judged every round) gets no longer for it.
    if (s.quarantined_until > round) return std::nullopt;
    if (s.strikes < policy_.quarantine_strikes) return std::nullopt;
    uint64_t rounds = policy_.first_rounds;
    for (uint64_t q = 0; q < s.quarantines && rounds < policy_.max_rounds; q++) rounds *= 2;
    rounds = std::min(rounds, policy_.max_rounds);
    s.quarantines++;
    s.quarantined_until = round + 1 + rounds;
    s.strikes = policy_.quarantine_strikes - policy_.refusal_strikes;
    return Quarantine{member, s.quarantined_until, rounds, s};
}

bool MemberScores::quarantined(uint64_t member, uint64_t round) const {
    MutexLock lock(mutex_);
    const auto it = scores_.find(member);
    return it != scores_.end() && it->second.quarantined_until > round;
}

std::optional<MemberScore> MemberScores::score(uint64_t member) const {
    MutexLock lock(mutex_);
    const auto it = scores_.find(member);
    if (it == scores_.end()) return std::nullopt;
    return it->second;
}

std::vector<uint64_t> MemberScores::quarantined_in(uint64_t round) const {
    MutexLock lock(mutex_);
    std::vector<uint64_t> out;
    for (const auto& [member, s] : scores_)
        if (s.quarantined_until > round) out.push_back(member);
    return out;
}

}  // namespace starling
