// The proposer's side of choosing a round's partner (CHOOSE_PARTNERS of docs/spec.md section 4),
// without I/O: which member to propose to next, in which mode, and when to listen for proposals
// instead, from the time and the answers it is given. RoundPeers::choose_partner drives it over
// gRPC with a PairingBook taking the proposals that arrive; the simulator (sim/) drives the same
// code over its simulated network.
//
// Order: members left out of their last round first (left_out_members) for kLeftOutShare of the
// pair timeout, then the deterministic partner until half of it, then members at random
// (random_candidates). Members that declined for good are not asked again; between two rounds of
// asking, the node listens for proposals for kPairRetry. The choice ends when the round has a
// partner, the pair timeout passes, or nobody is left to ask.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <set>
#include <vector>

#include "peer/pairing.h"

namespace starling {

struct ChoiceStep {
    enum class Kind { Propose, Listen, Done };
    Kind kind = Kind::Done;
    uint64_t to = 0;  // Propose: the member
    PairMode mode = PairMode::Random;
    SteadyClock::time_point until{};  // Listen: until then, or until the round has a partner
};

class PartnerChoice {
public:
    struct Start {
        std::optional<uint64_t> intended;  // the deterministic partner; none, or quarantined: none
        std::vector<uint64_t> candidates;  // random_candidates
        std::vector<uint64_t> left_out;    // left_out_members
        SteadyClock::time_point now{};
        std::chrono::milliseconds pair_timeout{};
    };
    explicit PartnerChoice(Start start);

    // What to do at `now`, given whether the round has a partner yet (the PairingBook's).
    ChoiceStep next(SteadyClock::time_point now, bool paired);
    // The answer to the proposal next() returned last: whether the round has a partner now, and
    // whether the member said "not yet" (it is not choosing for the round yet, or is busy). A
    // proposal that was never sent (the member unknown, or another of ours out) is declined.
    void answered(bool paired, bool ask_again);

    SteadyClock::time_point deadline() const { return deadline_; }

private:
    enum class Stage { Ask, LeftOutAnswered, IntendedAnswered, RandomAnswered };
    // The next of `ids` in turn from *next on that has not declined for good; with
    // skip_intended, not the deterministic partner before it has declined as such.
    std::optional<uint64_t> next_of(const std::vector<uint64_t>& ids, size_t* next,
                                    bool skip_intended);
    ChoiceStep propose(uint64_t to, PairMode mode, Stage answered_at);
    ChoiceStep random_or_listen(SteadyClock::time_point now);
    ChoiceStep listen_or_done(SteadyClock::time_point now);

    Start start_;
    SteadyClock::time_point deadline_, left_out_until_, random_from_;
    Stage stage_ = Stage::Ask;
    uint64_t last_to_ = 0;  // of the proposal last returned
    bool intended_declined_;
    std::set<uint64_t> declined_;  // random requests declined for good
    size_t next_candidate_ = 0, next_left_out_ = 0;
};

}  // namespace starling
