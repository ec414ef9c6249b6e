#include "data/bpe_trainer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "common/error.h"
#include "data/byte_level.h"
#include "data/pretokenize.h"

namespace starling {

namespace {

using Pair = uint64_t;  // first << 32 | second
Pair make_pair(uint32_t first, uint32_t second) { return uint64_t(first) << 32 | second; }
uint32_t first_of(Pair p) { return uint32_t(p >> 32); }
uint32_t second_of(Pair p) { return uint32_t(p); }

struct Word {
    std::vector<uint32_t> symbols;
    int64_t count = 0;
};

struct Candidate {
    int64_t count;
    Pair pair;
};

std::string characters_of(const std::string& bytes) {
    std::string out;
    for (char c : bytes) out += byte_level_char(uint8_t(c));
    return out;
}

std::string tokenizer_json(const TrainedBpe& trained) {
    using nlohmann::ordered_json;
    ordered_json vocab = ordered_json::object();
    for (size_t id = 0; id + 1 < trained.token_bytes.size(); id++)
        vocab[characters_of(trained.token_bytes[id])] = id;
    const size_t end_of_text = trained.token_bytes.size() - 1;
    vocab[std::string(kEndOfText)] = end_of_text;  // in the vocabulary too, as GPT-2 has it
    ordered_json merges = ordered_json::array();
    for (const auto& [first, second] : trained.merges)
        merges.push_back(characters_of(trained.token_bytes[size_t(first)]) + " " +
                         characters_of(trained.token_bytes[size_t(second)]));
    const ordered_json added_tokens = ordered_json::array({{{"id", end_of_text},
                                                            {"content", std::string(kEndOfText)},
                                                            {"single_word", false},
                                                            {"lstrip", false},
                                                            {"rstrip", false},
                                                            {"normalized", false},
                                                            {"special", true}}});
    return byte_level_bpe_json(vocab, merges, added_tokens, true);
}

class Trainer {
public:
    explicit Trainer(std::string_view text) {
        std::unordered_map<std::string_view, int64_t> counts;
        Gpt2PreTokenizer().for_each_word(text, [&](std::string_view w) { counts[w]++; });
        for (int i = 0; i < 256; i++) {
            const uint8_t byte = gpt2_byte_order()[size_t(i)];
            tokens_.emplace_back(1, char(byte));
            byte_token_[byte] = uint32_t(i);
            id_of_bytes_[tokens_.back()] = uint32_t(i);
        }
        // The order of words and pairs here does not matter: counts are sums, and the queue's
        // order is total (count, then the pair's byte strings, which no two tokens share).
        for (const auto& [text_of_word, count] : counts) {
            Word w;
            w.count = count;
            for (char c : text_of_word) w.symbols.push_back(byte_token_[uint8_t(c)]);
            add_pairs(w, uint32_t(words_.size()), nullptr);
            words_.push_back(std::move(w));
        }
        for (const auto& [pair, count] : pair_counts_) queue_.push({count, pair});
    }

    // Merges the best pair; false when none is left.
    bool merge_next() {
        while (!queue_.empty()) {
            const Candidate top = queue_.top();
            queue_.pop();
            const auto it = pair_counts_.find(top.pair);
            const int64_t now = it == pair_counts_.end() ? 0 : it->second;
            if (now <= 0) continue;
            if (now != top.count) {  // fell since it was queued: back in line at its count
                queue_.push({now, top.pair});
                continue;
            }
            merge(top.pair);
            return true;
        }
        return false;
    }

    TrainedBpe result() && {
        TrainedBpe trained;
        trained.token_bytes = std::move(tokens_);
        trained.token_bytes.emplace_back(kEndOfText);
        trained.merges = std::move(merges_);
        trained.hf_json = tokenizer_json(trained);
        return trained;
    }

    size_t token_count() const { return tokens_.size(); }

private:
    // Adds w's pairs to the counts and notes w under each; collects them in changed if given.
    void add_pairs(const Word& w, uint32_t index, std::unordered_set<Pair>* changed) {
        for (size_t i = 0; i + 1 < w.symbols.size(); i++) {
            const Pair p = make_pair(w.symbols[i], w.symbols[i + 1]);
            pair_counts_[p] += w.count;
            words_with_[p].push_back(index);
            if (changed) changed->insert(p);
        }
    }
    void remove_pairs(const Word& w) {
        for (size_t i = 0; i + 1 < w.symbols.size(); i++)
            pair_counts_[make_pair(w.symbols[i], w.symbols[i + 1])] -= w.count;
    }

    void merge(Pair pair) {
        const uint32_t a = first_of(pair), b = second_of(pair);
        const std::string joined = tokens_[a] + tokens_[b];
        // Two merges can spell the same bytes ("ab c", "a bc"): they share the token.
        auto [existing, is_new] = id_of_bytes_.try_emplace(joined, uint32_t(tokens_.size()));
        if (is_new) tokens_.push_back(joined);
        const uint32_t merged = existing->second;
        merges_.emplace_back(int(a), int(b));

        std::vector<uint32_t> holders = std::move(words_with_[pair]);
        words_with_.erase(pair);
        std::sort(holders.begin(), holders.end());
        holders.erase(std::unique(holders.begin(), holders.end()), holders.end());
        std::unordered_set<Pair> changed;
        for (uint32_t index : holders) {
            Word& w = words_[index];
            std::vector<uint32_t> next;
            for (size_t i = 0; i < w.symbols.size(); i++) {
                if (i + 1 < w.symbols.size() && w.symbols[i] == a && w.symbols[i + 1] == b) {
                    next.push_back(merged);
                    i++;
                } else {
                    next.push_back(w.symbols[i]);
                }
            }
            // Noted under the pair, merged away since.
            if (next.size() == w.symbols.size()) continue;
            remove_pairs(w);
            w.symbols = std::move(next);
            add_pairs(w, index, &changed);
        }
        pair_counts_.erase(pair);
        // Only pairs with the new token can have grown; the others wait in the queue at their old
        // count and are put back at the new one when they come up.
        for (Pair p : changed)
            if (first_of(p) == merged || second_of(p) == merged) queue_.push({pair_counts_[p], p});
    }

    std::vector<std::string> tokens_;
    std::unordered_map<std::string, uint32_t> id_of_bytes_;
    uint32_t byte_token_[256] = {};
    std::vector<Word> words_;
    std::vector<std::pair<int, int>> merges_;
    std::unordered_map<Pair, int64_t> pair_counts_;
    std::unordered_map<Pair, std::vector<uint32_t>> words_with_;

    // Most frequent first; on a tie, the smaller (first, second) byte strings.
    struct Later {
        const std::vector<std::string>* tokens;
        bool operator()(const Candidate& x, const Candidate& y) const {
            if (x.count != y.count) return x.count < y.count;
            const std::string& x1 = (*tokens)[first_of(x.pair)];
            const std::string& y1 = (*tokens)[first_of(y.pair)];
            if (x1 != y1) return x1 > y1;
            return (*tokens)[second_of(x.pair)] > (*tokens)[second_of(y.pair)];
        }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, Later> queue_{Later{&tokens_}};
};

}  // namespace

TrainedBpe train_bpe(std::string_view text, int vocab_size) {
    if (vocab_size < 257 || vocab_size > 65536)
        throw Error(
            "train-tokenizer: vocab size " + std::to_string(vocab_size) +
            " is outside [257, 65536]: 256 byte tokens and <|endoftext|> at least, uint16 ids at most");
    Trainer trainer(text);
    while (trainer.token_count() + 1 < size_t(vocab_size) && trainer.merge_next()) {
    }
    return std::move(trainer).result();
}

}  // namespace starling
