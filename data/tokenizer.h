// Tokenizers behind one interface: the byte tokenizer (one token per byte, vocabulary 256, no
// file) and byte-level BPE read from a Hugging Face tokenizer.json (bpe_tokenizer.h).
// load_tokenizer picks one by path, so callers never branch on the kind.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace starling {

class Tokenizer {
public:
    virtual ~Tokenizer() = default;

    // Largest token id + 1; a model needs at least this many embedding rows.
    virtual int vocab_size() const = 0;
    virtual std::vector<uint16_t> encode(std::string_view text) const = 0;
    // The exact inverse of encode for any bytes. Throws Error for a token that is not in the
    // vocabulary, naming it and its position.
    virtual std::string decode(std::span<const uint16_t> tokens) const = 0;
    // tokenizer.json in the form Hugging Face's tokenizers library loads.
    virtual std::string hf_json() const = 0;
    // The tokenizer.json this was read from; empty for the byte tokenizer.
    virtual const std::string& path() const = 0;
    // "bytes (256 tokens)" or "byte-level BPE FILE (4096 tokens, 3839 merges)", for messages.
    virtual std::string describe() const = 0;
    // Whether a model with this many embedding rows goes with this tokenizer: the byte tokenizer
    // needs exactly 256, a file's vocabulary model_vocab_size less at most kMaxPaddingRows
    // (padding).
    virtual bool fits(int model_vocab_size) const = 0;
};

// Embedding rows a model may have past its tokenizer.json's vocabulary: padding to a multiple of
// 64 adds at most 63. More means a model of another, larger vocabulary (a 256-token file for a
// 4096-row model is the wrong file, and its text would come out as garbage).
inline constexpr int kMaxPaddingRows = 63;

class ByteTokenizer : public Tokenizer {
public:
    static constexpr int kVocabSize = 256;

    int vocab_size() const override { return kVocabSize; }
    // One token per byte, the byte's unsigned value.
    std::vector<uint16_t> encode(std::string_view text) const override;
    std::string decode(std::span<const uint16_t> tokens) const override;
    // A byte-level BPE without merges whose vocabulary maps GPT-2's character for byte b to id b,
    // so Hugging Face's tokenizers encode text to these ids and decode them to the bytes.
    std::string hf_json() const override;
    const std::string& path() const override;
    std::string describe() const override;
    bool fits(int model_vocab_size) const override { return model_vocab_size == kVocabSize; }
};

// The byte tokenizer for an empty path, else the tokenizer.json at path (BpeTokenizer).
// Throws Error naming the file and the problem.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace starling
