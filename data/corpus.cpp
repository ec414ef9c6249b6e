#include "data/corpus.h"

#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "common/errno_text.h"
#include "common/error.h"

namespace starling {

namespace {

bool is_digit(char c) { return c >= '0' && c <= '9'; }

bool is_letter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

// Length of the verse reference and the space after it at the start of line, or 0 if none.
size_t reference_length(std::string_view line) {
    size_t i = 0;
    const size_t n = line.size();
    if (i < n && is_digit(line[i])) ++i;  // "1Cor", "2Ki", "3Jn"
    const size_t book = i;
    while (i < n && is_letter(line[i])) ++i;
    if (i == book) return 0;
    const size_t chapter = i;
    while (i < n && is_digit(line[i])) ++i;
    if (i == chapter || i >= n || line[i] != ':') return 0;
    ++i;
    const size_t verse = i;
    while (i < n && is_digit(line[i])) ++i;
    if (i == verse || i >= n || line[i] != ' ') return 0;
    return i + 1;
}

std::string shorten(std::string_view line) {
    constexpr size_t kMax = 80;
    if (line.size() <= kMax) return std::string(line);
    return std::string(line.substr(0, kMax)) + "...";
}

const char* kInstallHint =
    "install it with scripts/setup (Debian packages bible-kjv and bible-kjv-text)";

}  // namespace

std::string strip_verse_references(std::string_view raw, std::string_view source) {
    std::string text;
    text.reserve(raw.size());
    size_t line_number = 0;
    size_t start = 0;
    while (start < raw.size()) {
        size_t end = raw.find('\n', start);
        if (end == std::string_view::npos) end = raw.size();
        std::string_view line = raw.substr(start, end - start);
        ++line_number;
        const size_t ref = reference_length(line);
        if (ref == 0) {
            throw Error(std::string(source) + ": line " + std::to_string(line_number) +
                        " does not start with a verse reference: \"" + shorten(line) + "\"");
        }
        if (line_number > 1) text += '\n';
        text.append(line.substr(ref));
        start = end + 1;
    }
    if (line_number == 0) throw Error(std::string(source) + ": produced no verses");
    return text;
}

std::string read_kjv_text() {
    const std::string source = std::string("`") + kKjvCommand + "`";
    const std::string command = std::string(kKjvCommand) + " </dev/null 2>&1";
    std::FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) throw Error(source + ": cannot start: " + errno_text(errno));

    std::string raw;
    char buffer[1 << 16];
    size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof(buffer), pipe)) > 0) raw.append(buffer, n);
    const bool read_failed = std::ferror(pipe) != 0;
    const int status = ::pclose(pipe);

    if (status == -1) throw Error(source + ": cannot get its exit status: " + errno_text(errno));
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
        throw Error(source + ": the `bible` program was not found; " + kInstallHint);
    }
    if (WIFSIGNALED(status)) {
        throw Error(source + ": killed by signal " + std::to_string(WTERMSIG(status)));
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        throw Error(source + ": failed with exit status " + std::to_string(WEXITSTATUS(status)) +
                    ": " + shorten(raw.substr(0, raw.find('\n'))) + "; " + kInstallHint);
    }
    if (read_failed) throw Error(source + ": reading its output failed");
    if (raw.empty()) throw Error(source + ": produced no output; " + kInstallHint);
    try {
        return strip_verse_references(raw, source);
    } catch (const Error& e) {
        throw Error(std::string(e.what()) + "; is the KJV text installed? " + kInstallHint);
    }
}

std::string read_text_file(const std::string& path) {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::file_status st = fs::status(path, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
        throw Error(path + ": cannot access: " + ec.message());
    if (!fs::exists(st)) throw Error(path + ": no such file");
    if (fs::is_directory(st)) throw Error(path + ": is a directory, expected a text file");

    struct Closer {
        void operator()(std::FILE* f) const { std::fclose(f); }
    };
    std::unique_ptr<std::FILE, Closer> file(std::fopen(path.c_str(), "rb"));
    if (!file) throw Error(path + ": cannot open: " + errno_text(errno));
    std::string text;
    char buffer[1 << 16];
    size_t n = 0;
    while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) text.append(buffer, n);
    if (std::ferror(file.get())) throw Error(path + ": read failed: " + errno_text(errno));
    return text;
}

}  // namespace starling
