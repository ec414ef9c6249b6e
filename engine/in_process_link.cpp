#include "engine/in_process_link.h"

#include <algorithm>
#include <utility>
#include <fmt/format.h>

#include "common/error.h"
#include "peer/partners.h"

namespace starling {

namespace {

// The part number DiLoCo's published messages are posted under (from = to = the author).
constexpr uint32_t kPublished = 0xffffffffu;

// Decodes a whole message; the codec's refusal is the error.
std::string decoded_into(const codec::EncodedMessage& message, codec::MessageDecoder& decoder) {
    try {
        codec::decode_to_end(message.header, message.chunks, decoder);
        return {};
    } catch (const Error& e) {
        return e.what();
    }
}

}  // namespace

class InProcessLink : public RoundLink {
public:
    InProcessLink(InProcessBoard& board, uint64_t self) : board_(board), self_(self) {}

    std::vector<uint64_t> partners(uint64_t round) override {
        MutexLock lock(board_.mutex_);
        board_.check_round(round);
        const auto found = board_.partners_.find(self_);
        return found == board_.partners_.end() ? std::vector<uint64_t>() : found->second;
    }

    std::vector<LinkExchanged> exchange(uint64_t round, uint64_t partner,
                                        std::vector<LinkPart> parts, uint64_t /*bytes*/,
                                        uint64_t tokens) override {
        std::vector<LinkExchanged> results(parts.size());
        for (uint32_t p = 0; p < parts.size(); p++) {
            auto message =
                std::make_shared<const codec::EncodedMessage>(drained_message(parts[p].outgoing));
            results[p].bytes_sent = message->bytes();
            board_.post(round, {self_, partner, p}, {std::move(message), tokens});
        }
        for (uint32_t p = 0; p < parts.size(); p++) {
            LinkExchanged& result = results[p];
            const auto theirs = board_.wait_for(round, {partner, self_, p}, partner);
            if (!theirs) {
                result.error = fmt::format("partner {:016x} left the round", partner);
                continue;
            }
            result.bytes_received = theirs->message->bytes();
            result.partner_tokens = theirs->tokens;
            result.error = decoded_into(*theirs->message, parts[p].incoming);
            result.received = result.error.empty();
        }
        return results;
    }

    void judged(uint64_t member, uint64_t round,
                const std::optional<std::string>& refusal) override {
        board_.judge(self_, member, round, refusal);
    }

    std::vector<uint64_t> quorum(uint64_t round) override {
        MutexLock lock(board_.mutex_);
        board_.check_round(round);
        return board_.members_;
    }

    void publish(uint64_t round, std::shared_ptr<const codec::EncodedMessage> message,
                 uint64_t tokens) override {
        board_.post(round, {self_, self_, kPublished}, {std::move(message), tokens});
    }

    std::vector<LinkGathered> gather(uint64_t round, std::span<const uint64_t> members,
                                     std::span<codec::MessageDecoder* const> decoders,
                                     uint64_t* bytes) override {
        std::vector<LinkGathered> gathered(members.size());
        for (size_t i = 0; i < members.size(); i++) {
            const uint64_t member = members[i];
            const auto post = board_.wait_for(round, {member, member, kPublished}, member);
            if (!post) {
                gathered[i].error = fmt::format("member {:016x} left the round", member);
                continue;
            }
            *bytes += post->message->bytes();
            gathered[i].tokens = post->tokens;
            gathered[i].error = decoded_into(*post->message, *decoders[i]);
        }
        return gathered;
    }

private:
    InProcessBoard& board_;
    const uint64_t self_;
};

void InProcessBoard::begin_round(uint64_t round, std::vector<uint64_t> members, size_t group_size) {
    std::sort(members.begin(), members.end());
    MutexLock lock(mutex_);
    std::map<uint64_t, std::vector<uint64_t>> partners;
    for (const auto& group : deterministic_groups(round, members, group_size)) {
        for (const uint64_t member : group) {
            std::vector<uint64_t>& of = partners[member];
            for (const uint64_t other : group)
                if (other != member && !kept_apart(member, other, round)) of.push_back(other);
        }
    }
    round_ = round;
    members_ = std::move(members);
    partners_ = std::move(partners);
    posts_.clear();
    abandoned_.clear();
}

bool InProcessBoard::kept_apart(uint64_t a, uint64_t b, uint64_t round) {
    return scores_[a].quarantined(b, round) || scores_[b].quarantined(a, round);
}

void InProcessBoard::judge(uint64_t judge, uint64_t member, uint64_t round,
                           const std::optional<std::string>& refusal) {
    MutexLock lock(mutex_);
    MemberScores& scores = scores_[judge];
    Judgement judgement{round, judge, member, refusal.has_value(), false};
    if (refusal)
        judgement.quarantined = scores.refused(member, round, *refusal).has_value();
    else
        scores.accepted(member);
    judgements_.push_back(judgement);
}

std::vector<InProcessBoard::Judgement> InProcessBoard::take_judgements() {
    MutexLock lock(mutex_);
    return std::exchange(judgements_, {});
}

std::shared_ptr<const codec::EncodedMessage> InProcessBoard::sent(uint64_t round, uint64_t from,
                                                                  uint64_t to, uint32_t part) {
    const auto post = wait_for(round, {from, to, part}, from);
    return post ? post->message : nullptr;
}

void InProcessBoard::abandon(uint64_t member) {
    MutexLock lock(mutex_);
    abandoned_.insert(member);
    changed_.notify_all();
}

std::unique_ptr<RoundLink> InProcessBoard::link(uint64_t member) {
    return std::make_unique<InProcessLink>(*this, member);
}

void InProcessBoard::check_round(uint64_t round) const {
    if (round != round_)
        throw Error(fmt::format("in-process link: round {} asked while the board holds round {}",
                                round, round_));
}

void InProcessBoard::post(uint64_t round, const PostKey& key, Post post) {
    MutexLock lock(mutex_);
    check_round(round);
    posts_[key] = std::move(post);
    changed_.notify_all();
}

std::optional<InProcessBoard::Post> InProcessBoard::wait_for(uint64_t round, const PostKey& key,
                                                             uint64_t author) {
    MutexLock lock(mutex_);
    check_round(round);
    lock.wait(changed_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return posts_.contains(key) || abandoned_.contains(author);
    });
    const auto found = posts_.find(key);
    if (found == posts_.end()) return std::nullopt;
    return found->second;
}

}  // namespace starling
