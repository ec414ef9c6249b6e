#include "data/bpe_tokenizer.h"

#include <limits>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "data/byte_level.h"
#include "data/corpus.h"

namespace starling {

namespace {

using nlohmann::json;

constexpr int64_t kMaxTokenId = std::numeric_limits<uint16_t>::max();
// Words longer than this are rare (runs of spaces, long numbers) and not worth remembering.
constexpr size_t kMaxCachedWordBytes = 64;

// Reads the parts of a tokenizer.json, each failure an Error naming the file.
class Reader {
public:
    explicit Reader(std::string source) : source_(std::move(source)) {}

    [[noreturn]] void fail(const std::string& problem) const {
        throw Error(source_ + ": " + problem);
    }

    const json& field(const json& object, const char* key, const std::string& where) const {
        if (!object.is_object() || !object.contains(key)) fail(where + " has no \"" + key + "\"");
        return object[key];
    }
    std::string string_field(const json& object, const char* key, const std::string& where) const {
        const json& value = field(object, key, where);
        if (!value.is_string()) fail(where + "." + key + " is not a string");
        return value.get<std::string>();
    }
    // A flag that must be absent, null or false: a feature this reader does not implement.
    void require_off(const json& object, const char* key, const std::string& where) const {
        if (!object.is_object() || !object.contains(key)) return;
        const json& value = object[key];
        const bool off = value.is_null() || (value.is_boolean() && !value.get<bool>()) ||
                         (value.is_string() && value.get<std::string>().empty());
        if (!off) fail(where + "." + key + " = " + value.dump() + " is not supported");
    }
    int64_t id_of(const json& value, const std::string& what) const {
        if (!value.is_number_integer())
            fail(what + " has an id that is not an integer: " + value.dump());
        const auto id = value.get<int64_t>();
        if (id < 0 || id > kMaxTokenId)
            fail(what + " has id " + std::to_string(id) +
                 ", outside [0, 65535] (shards hold uint16 tokens)");
        return id;
    }

private:
    std::string source_;
};

// GPT-2's "Ġt he" or ["Ġt", "he"].
std::pair<std::string, std::string> merge_parts(const Reader& reader, const json& merge,
                                                size_t index) {
    const std::string where = "merge " + std::to_string(index) + " (" + merge.dump() + ")";
    if (merge.is_string()) {
        const std::string text = merge.get<std::string>();
        const size_t space = text.find(' ');
        if (space == std::string::npos || space == 0 || space + 1 == text.size() ||
            text.find(' ', space + 1) != std::string::npos)
            reader.fail(where + " is not two tokens separated by one space");
        return {text.substr(0, space), text.substr(space + 1)};
    }
    if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string())
        return {merge[0].get<std::string>(), merge[1].get<std::string>()};
    reader.fail(where + " is neither \"a b\" nor [\"a\", \"b\"]");
}

void check_byte_level(const Reader& reader, const json& root, const char* key) {
    const json& part = reader.field(root, key, "the file");
    const std::string type = part.is_object() && part.contains("type") && part["type"].is_string()
                                 ? part["type"].get<std::string>()
                                 : part.dump();
    if (type != "ByteLevel")
        reader.fail(std::string(key) + " " + type +
                    " is not supported: only ByteLevel (GPT-2's byte-level BPE)");
}

}  // namespace

BpeTokenizer BpeTokenizer::parse(const std::string& json_text, const std::string& source) {
    const Reader reader(source);
    json root;
    try {
        root = json::parse(json_text);
    } catch (const json::exception& e) {
        reader.fail(std::string("not JSON: ") + e.what());
    }
    if (!root.is_object()) reader.fail("not a tokenizer.json: the top level is not an object");

    BpeTokenizer t;
    t.source_ = source;
    t.json_text_ = json_text;

    const json& model = reader.field(root, "model", "the file");
    const std::string type = reader.string_field(model, "type", "model");
    if (type != "BPE") reader.fail("model.type is \"" + type + "\": only BPE is supported");
    for (const char* key : {"dropout", "continuing_subword_prefix", "end_of_word_suffix",
                            "byte_fallback", "ignore_merges"})
        reader.require_off(model, key, "model");
    if (root.contains("normalizer") && !root["normalizer"].is_null())
        reader.fail("normalizer " + root["normalizer"].value("type", root["normalizer"].dump()) +
                    " is not supported: only none, as GPT-2");
    check_byte_level(reader, root, "pre_tokenizer");
    check_byte_level(reader, root, "decoder");
    const json& pre = root["pre_tokenizer"];
    reader.require_off(pre, "add_prefix_space", "pre_tokenizer");
    const bool use_regex = pre.value("use_regex", true);
    if (use_regex) t.pre_tokenizer_ = std::make_shared<const Gpt2PreTokenizer>();

    // The vocabulary: id -> characters, then each id's bytes.
    const json& vocab = reader.field(model, "vocab", "model");
    if (!vocab.is_object()) reader.fail("model.vocab is not an object of token: id");
    std::unordered_map<std::string, uint16_t> id_of_token;
    std::vector<std::string> characters;
    auto claim = [&](int64_t id, const std::string& token) {
        if (size_t(id) >= characters.size()) {
            characters.resize(size_t(id) + 1);
            t.is_token_.resize(size_t(id) + 1, false);
        }
        if (t.is_token_[size_t(id)])
            reader.fail("tokens " + json(characters[size_t(id)]).dump() + " and " +
                        json(token).dump() + " have the same id " + std::to_string(id));
        t.is_token_[size_t(id)] = true;
        characters[size_t(id)] = token;
    };
    for (const auto& [token, value] : vocab.items()) {
        const int64_t id = reader.id_of(value, "token " + json(token).dump());
        claim(id, token);
        id_of_token[token] = uint16_t(id);
    }

    // Added tokens decode to their content as it is; one may also be in the vocab with its id.
    std::unordered_map<uint16_t, std::string> added_content;
    if (root.contains("added_tokens")) {
        const json& added = root["added_tokens"];
        if (!added.is_array()) reader.fail("added_tokens is not an array");
        for (size_t i = 0; i < added.size(); i++) {
            const std::string where = "added_tokens[" + std::to_string(i) + "]";
            const std::string content = reader.string_field(added[i], "content", where);
            if (content.empty()) reader.fail(where + " has an empty content");
            const int64_t id = reader.id_of(reader.field(added[i], "id", where), where);
            for (const char* key : {"lstrip", "rstrip", "single_word"})
                reader.require_off(added[i], key, where);
            const auto in_vocab = id_of_token.find(content);
            if (in_vocab == id_of_token.end() || in_vocab->second != id) claim(id, content);
            added_content[uint16_t(id)] = content;
            t.added_.emplace_back(content, uint16_t(id));
        }
    }

    t.vocab_size_ = int(characters.size());
    t.token_bytes_.resize(characters.size());
    for (size_t id = 0; id < characters.size(); id++) {
        if (!t.is_token_[id]) continue;
        if (const auto added = added_content.find(uint16_t(id)); added != added_content.end()) {
            t.token_bytes_[id] = added->second;
        } else if (std::optional<std::string> bytes = byte_level_decode(characters[id])) {
            t.token_bytes_[id] = std::move(*bytes);
        } else {
            reader.fail("token " + json(characters[id]).dump() + " (id " + std::to_string(id) +
                        ") has a character outside GPT-2's byte-level alphabet");
        }
    }
    for (int b = 0; b < 256; b++) {
        const auto it = id_of_token.find(std::string(byte_level_char(uint8_t(b))));
        if (it == id_of_token.end())
            reader.fail("model.vocab lacks the token for byte " + std::to_string(b) + " (" +
                        json(std::string(byte_level_char(uint8_t(b)))).dump() +
                        "): byte-level BPE needs all 256");
        t.byte_token_[size_t(b)] = it->second;
    }

    const json& merges = reader.field(model, "merges", "model");
    if (!merges.is_array()) reader.fail("model.merges is not an array");
    for (size_t rank = 0; rank < merges.size(); rank++) {
        const auto [first, second] = merge_parts(reader, merges[rank], rank);
        uint16_t ids[3];
        const std::string tokens[3] = {first, second, first + second};
        for (int k = 0; k < 3; k++) {
            const auto it = id_of_token.find(tokens[k]);
            if (it == id_of_token.end())
                reader.fail("merge " + std::to_string(rank) + " (" + merges[rank].dump() +
                            "): " + json(tokens[k]).dump() + " is not in model.vocab");
            ids[k] = it->second;
        }
        // A pair listed twice keeps its later rank, as Hugging Face's reader does.
        t.merges_[pair_key(ids[0], ids[1])] = {uint32_t(rank), ids[2]};
    }
    t.merge_count_ = merges.size();
    return t;
}

BpeTokenizer BpeTokenizer::read(const std::string& path) {
    return parse(read_text_file(path), path);
}

std::string BpeTokenizer::describe() const {
    return "byte-level BPE " + source_ + " (" + std::to_string(vocab_size_) + " tokens, " +
           std::to_string(merge_count_) + " merges)";
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<uint16_t>& out) const {
    std::vector<uint16_t> symbols(word.size());
    for (size_t i = 0; i < word.size(); i++) symbols[i] = byte_token_[uint8_t(word[i])];
    // GPT-2's loop: the lowest-ranked pair present, merged wherever it occurs left to right.
    while (symbols.size() > 1) {
        const Merge* best = nullptr;
        uint32_t best_key = 0;
        for (size_t i = 0; i + 1 < symbols.size(); i++) {
            const uint32_t key = pair_key(symbols[i], symbols[i + 1]);
            const auto it = merges_.find(key);
            if (it != merges_.end() && (best == nullptr || it->second.rank < best->rank)) {
                best = &it->second;
                best_key = key;
            }
        }
        if (best == nullptr) break;
        size_t kept = 0;
        for (size_t i = 0; i < symbols.size(); i++) {
            if (i + 1 < symbols.size() && pair_key(symbols[i], symbols[i + 1]) == best_key) {
                symbols[kept++] = best->result;
                i++;
            } else {
                symbols[kept++] = symbols[i];
            }
        }
        symbols.resize(kept);
    }
    out.insert(out.end(), symbols.begin(), symbols.end());
}

void BpeTokenizer::encode_ordinary(
    std::string_view text, std::vector<uint16_t>& out,
    std::unordered_map<std::string, std::vector<uint16_t>>& cache) const {
    const auto word = [&](std::string_view w) {
        if (w.size() > kMaxCachedWordBytes) return encode_word(w, out);
        auto [it, inserted] = cache.try_emplace(std::string(w));
        if (inserted) encode_word(w, it->second);
        out.insert(out.end(), it->second.begin(), it->second.end());
    };
    if (text.empty()) return;
    if (pre_tokenizer_) {
        pre_tokenizer_->for_each_word(text, word);
    } else {
        encode_word(text, out);
    }
}

std::vector<uint16_t> BpeTokenizer::encode(std::string_view text) const {
    std::vector<uint16_t> out;
    out.reserve(text.size() / 3);
    std::unordered_map<std::string, std::vector<uint16_t>> cache;
    // Each added token's next occurrence at or after pos; the earliest wins, the longest on a tie.
    std::vector<size_t> next(added_.size());
    for (size_t k = 0; k < added_.size(); k++) next[k] = text.find(added_[k].first);
    size_t pos = 0;
    while (pos < text.size()) {
        size_t start = std::string_view::npos, chosen = 0;
        for (size_t k = 0; k < added_.size(); k++) {
            if (next[k] != std::string_view::npos && next[k] < pos)
                next[k] = text.find(added_[k].first, pos);
            if (next[k] < start || (next[k] == start && start != std::string_view::npos &&
                                    added_[k].first.size() > added_[chosen].first.size())) {
                start = next[k];
                chosen = k;
            }
        }
        if (start == std::string_view::npos) {
            encode_ordinary(text.substr(pos), out, cache);
            break;
        }
        encode_ordinary(text.substr(pos, start - pos), out, cache);
        out.push_back(added_[chosen].second);
        pos = start + added_[chosen].first.size();
    }
    return out;
}

std::string BpeTokenizer::decode(std::span<const uint16_t> tokens) const {
    std::string text;
    for (size_t i = 0; i < tokens.size(); i++) {
        const uint16_t id = tokens[i];
        if (id >= token_bytes_.size() || !is_token_[id])
            throw Error(source_ + ": token " + std::to_string(id) + " at position " +
                        std::to_string(i) + " is not in the vocabulary");
        text += token_bytes_[id];
    }
    return text;
}

}  // namespace starling
