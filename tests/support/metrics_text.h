// Reading Prometheus's text exposition format in tests: a series' value, the families by type.
#pragma once

#include <map>
#include <optional>
#include <regex>
#include <string>

namespace starling::test {

// The value of `series` (the name and labels as the text writes them, e.g.
// `starling_peers{state="alive"}`), or nullopt when the scrape does not hold it.
inline std::optional<double> sample_value(const std::string& text, const std::string& series) {
    const std::string line = "\n" + series + " ";
    const size_t at = text.find(line);
    if (at == std::string::npos) return std::nullopt;
    return std::stod(text.substr(at + line.size()));
}

// Every family of a scrape by name, with its type as its `# TYPE` line gives it.
inline std::map<std::string, std::string> metric_families(const std::string& text) {
    static const std::regex type_line(R"(# TYPE (\S+) (\S+))");
    std::map<std::string, std::string> families;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), type_line);
         it != std::sregex_iterator(); ++it)
        families[(*it)[1]] = (*it)[2];
    return families;
}

}  // namespace starling::test
