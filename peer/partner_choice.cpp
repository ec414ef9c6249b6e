#include "peer/partner_choice.h"

#include <algorithm>

namespace starling {

PartnerChoice::PartnerChoice(Start start)
    : start_(std::move(start)),
      deadline_(start_.now + start_.pair_timeout),
      left_out_until_(start_.now + std::chrono::duration_cast<SteadyClock::duration>(
                                       start_.pair_timeout * kLeftOutShare)),
      random_from_(start_.now + start_.pair_timeout / 2),
      intended_declined_(!start_.intended) {}

std::optional<uint64_t> PartnerChoice::next_of(const std::vector<uint64_t>& ids, size_t* next,
                                               bool skip_intended) {
    for (size_t tried = 0; tried < ids.size(); tried++) {
        const uint64_t id = ids[(*next)++ % ids.size()];
        if (declined_.count(id) || (skip_intended && id == start_.intended && !intended_declined_))
            continue;
        return id;
    }
    return std::nullopt;
}

ChoiceStep PartnerChoice::propose(uint64_t to, PairMode mode, Stage answered_at) {
    stage_ = answered_at;
    last_to_ = to;
    return {ChoiceStep::Kind::Propose, to, mode, {}};
}

ChoiceStep PartnerChoice::next(SteadyClock::time_point now, bool paired) {
    if (paired || now >= deadline_) return {};
    switch (stage_) {
        case Stage::Ask:
            if (now < left_out_until_) {
                if (const auto wanted = next_of(start_.left_out, &next_left_out_, false)) {
                    return propose(*wanted, PairMode::Random, Stage::LeftOutAnswered);
                }
            }
            if (!intended_declined_) {
                return propose(*start_.intended, PairMode::Deterministic, Stage::IntendedAnswered);
            }
            return random_or_listen(now);
        case Stage::LeftOutAnswered:
            // Members left out get the node's attention first: it listens before asking on.
            stage_ = Stage::Ask;
            return {ChoiceStep::Kind::Listen, 0, PairMode::Random,
                    std::min(deadline_, now + kPairRetry)};
        case Stage::IntendedAnswered: return random_or_listen(now);
        case Stage::RandomAnswered: return listen_or_done(now);
    }
    return {};
}

ChoiceStep PartnerChoice::random_or_listen(SteadyClock::time_point now) {
    if (intended_declined_ || now >= random_from_) {
        if (const auto candidate = next_of(start_.candidates, &next_candidate_, true)) {
            return propose(*candidate, PairMode::Random, Stage::RandomAnswered);
        }
    }
    return listen_or_done(now);
}

ChoiceStep PartnerChoice::listen_or_done(SteadyClock::time_point now) {
    stage_ = Stage::Ask;
    const bool anyone_left =
        !intended_declined_ || std::any_of(start_.candidates.begin(), start_.candidates.end(),
                                           [&](uint64_t c) { return !declined_.count(c); });
    if (!anyone_left) return {};
    return {ChoiceStep::Kind::Listen, 0, PairMode::Random, std::min(deadline_, now + kPairRetry)};
}

void PartnerChoice::answered(bool paired, bool ask_again) {
    if (paired || ask_again) return;
    if (stage_ == Stage::IntendedAnswered)
        intended_declined_ = true;
    else
        declined_.insert(last_to_);
}

}  // namespace starling
