#include "data/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/error.h"

namespace starling {

namespace {

constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The JIT's backtracking stack: `\s+` and `\p{L}+` over a long run need more than the default 32
// KiB.
constexpr size_t kJitStackStart = 32 * 1024;
constexpr size_t kJitStackMax = 64 * 1024 * 1024;

std::string pcre2_message(int code) {
    PCRE2_UCHAR buffer[256];
    pcre2_get_error_message(code, buffer, sizeof buffer);
    return reinterpret_cast<const char*>(buffer);
}

}  // namespace

struct Gpt2PreTokenizer::Compiled {
    pcre2_code* code = nullptr;
    bool jit = false;
    ~Compiled() { pcre2_code_free(code); }
};

Gpt2PreTokenizer::Gpt2PreTokenizer() : compiled_(std::make_unique<Compiled>()) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    // UCP: \s, \p{L} and \p{N} by Unicode properties, as the regex engines GPT-2 and Hugging Face
    // use; MATCH_INVALID_UTF: bytes that are not UTF-8 are skipped by the search instead of failing
    // it.
    compiled_->code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kGpt2Pattern.data()), kGpt2Pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    if (compiled_->code == nullptr)
        throw Error("GPT-2 pre-tokenizer: PCRE2 cannot compile the pattern at offset " +
                    std::to_string(offset) + ": " + pcre2_message(error));
    compiled_->jit = pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE) == 0;
}

Gpt2PreTokenizer::~Gpt2PreTokenizer() = default;

void Gpt2PreTokenizer::for_each_word(std::string_view text,
                                     const std::function<void(std::string_view)>& word) const {
    const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> match(
        pcre2_match_data_create_from_pattern(compiled_->code, nullptr), &pcre2_match_data_free);
    const std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> context(
        pcre2_match_context_create(nullptr), &pcre2_match_context_free);
    const std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)> stack(
        compiled_->jit ? pcre2_jit_stack_create(kJitStackStart, kJitStackMax, nullptr) : nullptr,
        &pcre2_jit_stack_free);
    if (!match || !context || (compiled_->jit && !stack))
        throw Error("GPT-2 pre-tokenizer: out of memory");
    if (stack) pcre2_jit_stack_assign(context.get(), nullptr, stack.get());

    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t start = 0;
    while (start < text.size()) {
        const int rc = pcre2_match(compiled_->code, subject, text.size(), start, 0, match.get(),
                                   context.get());
        if (rc == PCRE2_ERROR_NOMATCH) {
            word(text.substr(start));  // only bytes that are not UTF-8 are left
            return;
        }
        if (rc < 0) throw Error("GPT-2 pre-tokenizer: PCRE2 match failed: " + pcre2_message(rc));
        const PCRE2_SIZE* bounds = pcre2_get_ovector_pointer(match.get());
        if (bounds[0] > start)
            word(text.substr(start, bounds[0] - start));  // a run that is not UTF-8
        word(text.substr(bounds[0], bounds[1] - bounds[0]));
        start = bounds[1];  // every alternative takes at least one character: no empty match
    }
}

std::vector<std::string> Gpt2PreTokenizer::split(std::string_view text) const {
    std::vector<std::string> words;
    for_each_word(text, [&](std::string_view w) { words.emplace_back(w); });
    return words;
}

}  // namespace starling
