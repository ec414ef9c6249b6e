// The experiment's network (engine/round_link.h): every member of a round in one process, each
// running its MemberRound on a thread of its own, their messages passed whole through a board.
// A message goes through the real codec path (encoded, framed and checksummed chunk by chunk,
// checked and decoded by the receiver) with its bytes counted; only the wire is missing. NoLoCo
// groups are deterministic_groups (peer/partners.h) of the round's members; DiLoCo's quorum is
// every member. Every member of the round must run it, or be abandoned: a member waits for its
// partners' messages without a deadline. Each member scores the others' messages as a PeerNode
// does (peer/member_scores.h): two members either of which has quarantined the other are not
// grouped together (each goes without the other, not to another group).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <tuple>
#include <vector>

#include "common/mutex.h"
#include "engine/round_link.h"
#include "peer/member_scores.h"

namespace starling {

class InProcessBoard {
public:
    // Round `round` begins for `members` (node ids), in NoLoCo groups of group_size; what the
    // last round left on the board is dropped.
    void begin_round(uint64_t round, std::vector<uint64_t> members, size_t group_size);
    // `member`'s round ended early (an error): whoever waits for its messages gets an error.
    void abandon(uint64_t member);
    // The link `member` runs its round over; the board must outlive it.
    std::unique_ptr<RoundLink> link(uint64_t member);

    // One member's judgement of another's message (RoundLink::judged), as it was made.
    struct Judgement {
        uint64_t round = 0;
        uint64_t judge = 0;
        uint64_t member = 0;
        bool refused = false;
        bool quarantined = false;  // this refusal started a quarantine
    };
    // The judgements since the last call, in the order they were made.
    std::vector<Judgement> take_judgements();

    // What `from` sent `to` as part `part` of `round`, once sent; nullptr when `from` was
    // abandoned first. The fault study's echoing member reads its partner's message with it.
    std::shared_ptr<const codec::EncodedMessage> sent(uint64_t round, uint64_t from, uint64_t to,
                                                      uint32_t part);

private:
    friend class InProcessLink;
    struct Post {
        std::shared_ptr<const codec::EncodedMessage> message;
        uint64_t tokens = 0;
    };
    using PostKey = std::tuple<uint64_t, uint64_t, uint32_t>;  // from, to, part

    void check_round(uint64_t round) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    void judge(uint64_t judge, uint64_t member, uint64_t round,
               const std::optional<std::string>& refusal);
    // Whether either of the two has quarantined the other for `round`.
    bool kept_apart(uint64_t a, uint64_t b, uint64_t round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
    void post(uint64_t round, const PostKey& key, Post post);
    // The post under `key`, once there; nullopt when its author was abandoned first.
    std::optional<Post> wait_for(uint64_t round, const PostKey& key, uint64_t author);

    mutable Mutex mutex_;
    std::condition_variable changed_;
    uint64_t round_ ABSL_GUARDED_BY(mutex_) = 0;
    std::vector<uint64_t> members_ ABSL_GUARDED_BY(mutex_);  // sorted
    std::map<uint64_t, std::vector<uint64_t>> partners_ ABSL_GUARDED_BY(mutex_);
    std::map<PostKey, Post> posts_ ABSL_GUARDED_BY(mutex_);  // DiLoCo's: to = from, part 0
    std::set<uint64_t> abandoned_ ABSL_GUARDED_BY(mutex_);
    // By judge: its scores of the others, kept across rounds.
    std::map<uint64_t, MemberScores> scores_ ABSL_GUARDED_BY(mutex_);
    std::vector<Judgement> judgements_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace starling
