// Text sources for `starling data prepare`: the King James Bible from the bible-kjv package (the
// default corpus, about 4.1 MB of verse text) or any text file.
#pragma once

#include <string>
#include <string_view>

namespace starling {

// The command read_kjv_text runs.
inline constexpr const char* kKjvCommand = "bible -f gen1:1-rev22:21";

// Every verse of the KJV, Genesis 1:1 to Revelation 22:21, without verse references, one verse a
// line, joined with '\n' (no trailing newline). Runs kKjvCommand; throws Error with an install
// hint when `bible` is missing or fails, or when its output is not the expected one verse a line.
std::string read_kjv_text();

// The parsing half of read_kjv_text: strips the leading verse reference ("Ge1:1 ", "1Cor13:4 ",
// "SSol1:1 ", that is an optional digit, letters, chapter:verse and one space) from every line of
// `bible -f` output and joins the verse texts with '\n'. A line without such a reference (or an
// empty output) throws Error naming `source` and the line number.
std::string strip_verse_references(std::string_view raw, std::string_view source);

// The whole file as bytes. Throws Error naming the path for a missing, unreadable or non-regular
// file.
std::string read_text_file(const std::string& path);

}  // namespace starling
