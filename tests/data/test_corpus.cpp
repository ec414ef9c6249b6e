#include <catch2/catch.hpp>
#include <cstdlib>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "data/corpus.h"
#include "test_util.h"

using Catch::Matchers::Contains;
using namespace starling::test;

namespace {

std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) lines.push_back(line);
    return lines;
}

// Sets an environment variable for one scope.
class ScopedEnv {
public:
    ScopedEnv(const char* name, const std::string& value) : name_(name) {
        if (const char* old = std::getenv(name)) old_ = old;
        ::setenv(name, value.c_str(), 1);
    }
    ~ScopedEnv() {
        if (old_) {
            ::setenv(name_, old_->c_str(), 1);
        } else {
            ::unsetenv(name_);
        }
    }
    ScopedEnv(const ScopedEnv&) = delete;
    ScopedEnv& operator=(const ScopedEnv&) = delete;

private:
    const char* name_;
    std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("read_kjv_text gives the verses of the KJV without references", "[data][corpus][kjv]") {
    const std::string text = starling::read_kjv_text();

    CHECK(
        text.starts_with("In the beginning God created the heaven and the earth.\n"
                         "And the earth was without form, and void;"));
    CHECK(text.ends_with("\nThe grace of our Lord Jesus Christ be with you all. Amen."));
    CHECK(text.size() > 3'900'000);
    CHECK(text.size() < 4'300'000);

    const std::vector<std::string> lines = split_lines(text);
    CHECK(lines.size() == 31102);  // verses in the KJV (Protestant canon)

    // No verse reference survives at the start of a line ("Ge1:1", "1Cor13:4", "SSol1:1").
    const std::regex reference("[0-9]?[A-Z][A-Za-z]*[0-9]+:[0-9]+");
    size_t with_reference = 0;
    size_t empty = 0;
    for (const std::string& line : lines) {
        if (std::regex_search(line, reference, std::regex_constants::match_continuous)) {
            if (with_reference++ < 3) UNSCOPED_INFO("line with a reference: " << line);
        }
        if (line.empty()) ++empty;
    }
    CHECK(with_reference == 0);
    CHECK(empty == 0);

    // Verses of books with a leading digit, two capitals and short names: whole lines, untouched.
    auto has_line = [&](const std::string& verse) {
        return text.find("\n" + verse + "\n") != std::string::npos;
    };
    CHECK(has_line("The song of songs, which is Solomon's."));  // SSol1:1
    CHECK(has_line(
        "Charity suffereth long, and is kind; charity envieth not; charity vaunteth not itself, "
        "is not puffed up,"));       // 1Cor13:4
    CHECK(has_line("Jesus wept."));  // John11:35
    CHECK(
        has_line("I have gone astray like a lost sheep; seek thy servant; for I do not forget thy "
                 "commandments."));  // Psa119:176
}

TEST_CASE("strip_verse_references keeps everything after the reference", "[data][corpus]") {
    const std::string raw =
        "Ge1:1 In the beginning.\n"
        "1Cor13:4 Charity suffereth long,\n"
        "SSol1:1 The song of songs.\n"
        "Rev22:21 Amen. See 3:16 and Ge1:1 here. \n";
    CHECK(
        starling::strip_verse_references(raw, "test") ==
        "In the beginning.\nCharity suffereth long,\nThe song of songs.\nAmen. See 3:16 and Ge1:1 here. ");
    CHECK(starling::strip_verse_references("Ge1:1 x", "test") == "x");  // no final newline
    CHECK(starling::strip_verse_references("Ge1:1 \n", "test") == "");  // empty verse text

    CHECK_THAT(error_message(
                   [] { starling::strip_verse_references("Ge1:1 a\nBad Book: 'x'\n", "`bible`"); }),
               Contains("`bible`") && Contains("line 2") && Contains("Bad Book"));
    CHECK_THAT(
        error_message([] { starling::strip_verse_references("Ge1:1 a\n\nGe1:2 b\n", "src"); }),
        Contains("line 2"));
    CHECK_THAT(error_message([] { starling::strip_verse_references("Ge1:1a\n", "src"); }),
               Contains("line 1"));
    CHECK_THAT(error_message([] { starling::strip_verse_references("", "src"); }),
               Contains("no verses"));
}

TEST_CASE("read_kjv_text explains a missing bible program", "[data][corpus]") {
    TempDir empty_path;
    ScopedEnv path("PATH", empty_path.path().string());
    CHECK_THAT(error_message([] { starling::read_kjv_text(); }),
               Contains("bible") && Contains("not found") && Contains("scripts/setup"));
}

TEST_CASE("read_text_file reads bytes exactly and names a bad path", "[data][corpus]") {
    TempDir dir;
    std::string bytes;
    for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
    for (int i = 0; i < 100000; ++i) bytes.push_back(static_cast<char>('a' + i % 26));
    put(dir.file("input.txt"), bytes);

    const std::string text = starling::read_text_file(dir.file("input.txt"));
    CHECK(text == bytes);

    put(dir.file("empty.txt"), "");
    CHECK(starling::read_text_file(dir.file("empty.txt")).empty());

    const std::string missing = dir.file("missing.txt");
    CHECK_THAT(error_message([&] { starling::read_text_file(missing); }),
               Contains(missing) && Contains("no such file"));
    CHECK_THAT(error_message([&] { starling::read_text_file(dir.path().string()); }),
               Contains(dir.path().string()) && Contains("directory"));
}
