#include "engine/config_keys.h"

#include <cmath>

#include <fmt/format.h>

#include "common/error.h"

namespace starling {

namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

std::string number(double value) { return fmt::format("{}", value); }

}  // namespace

bool KeyRange::holds(double value) const {
    if (std::isnan(value)) return false;
    const bool low = min_excluded ? value > min : value >= min;
    const bool high = max_excluded ? value < max : value <= max;
    return low && high;
}

bool KeyRange::any() const { return min == -kInfinity && max == kInfinity && !non_empty; }

std::string KeyRange::text() const {
    if (non_empty) return "not empty";
    if (any()) return "";
    if (max == kInfinity) return (min_excluded ? "above " : "at least ") + number(min);
    return std::string(min_excluded ? "in (" : "in [") + number(min) + ", " + number(max) +
           (max_excluded ? ")" : "]");
}

std::string KeyRange::requirement() const {
    if (non_empty) return "must not be empty";
    if (max == kInfinity && !min_excluded && min == 0) return "must not be negative";
    return "must be " + text();
}

KeyRange at_least(double min) { return {min, kInfinity}; }
KeyRange above(double min) { return {min, kInfinity, true}; }
KeyRange in_range(double min, double max) { return {min, max}; }
KeyRange in_range_open_max(double min, double max) { return {min, max, false, true}; }
KeyRange in_range_open_min(double min, double max) { return {min, max, true, false}; }
KeyRange non_empty() { return {-kInfinity, kInfinity, false, false, true}; }

void KeyRangeChecker::check_number(const char* key, double value, const KeyRange& range) const {
    if (!range.holds(value))
        throw Error("config: [" + section_ + "]." + key + " " + range.requirement() + ", got " +
                    number(value));
}

void KeyRangeChecker::check(const char* key, const std::string& value,
                            const KeyRange& range) const {
    if (range.non_empty && value.empty())
        throw Error("config: [" + section_ + "]." + key + " " + range.requirement());
}

std::string KeyDescriber::show(const std::string& value) { return "\"" + value + "\""; }

std::string KeyDescriber::show(const std::vector<std::string>& value) {
    std::string text;
    for (const std::string& item : value) text += (text.empty() ? "" : ", ") + show(item);
    return "[" + text + "]";
}

std::string KeyDescriber::show(const std::vector<double>& value) {
    std::string text;
    for (const double item : value) text += (text.empty() ? "" : ", ") + number(item);
    return "[" + text + "]";
}

std::string KeyDescriber::show(double value) { return number(value); }
// As a float prints: 0.7, not the 0.699999988 it is as a double.
std::string KeyDescriber::show(float value) { return fmt::format("{}", value); }

std::string key_help(const std::vector<KeyDescription>& keys, std::string_view section,
                     std::string_view key) {
    for (const KeyDescription& k : keys) {
        if (k.section != section || k.key != key) continue;
        return "[" + k.section + "]." + k.key + ": " + k.help +
               (k.range.empty() ? "" : " (" + k.range + ")");
    }
    throw Error("no config key [" + std::string(section) + "]." + std::string(key));
}

std::string keys_as_text(const std::vector<KeyDescription>& keys) {
    std::string text;
    for (const KeyDescription& k : keys) {
        std::string head = "[" + k.section + "] " + k.key;
        if (!k.default_value.empty()) head += " = " + k.default_value;
        text += fmt::format("  {:<40} {}", head, k.help);
        if (!k.range.empty()) text += " (" + k.range + ")";
        text += "\n";
    }
    return text;
}

std::string keys_as_markdown(const std::vector<KeyDescription>& keys) {
    std::string text;
    std::string section;
    for (const KeyDescription& k : keys) {
        if (k.section != section) {
            section = k.section;
            text += (text.empty() ? "" : "\n") + ("`[" + section + "]`\n\n");
            text += "| key | default | range | meaning |\n|---|---|---|---|\n";
        }
        const std::string value = k.default_value.empty() ? "" : "`" + k.default_value + "`";
        text += "| `" + k.key + "` | " + value + " | " + k.range + " | " + k.help + " |\n";
    }
    return text;
}

}  // namespace starling
