// starlingd's log formats (daemon/service/log_format.h), through a real spdlog logger.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <regex>
#include <spdlog/logger.h>
#include <spdlog/sinks/ostream_sink.h>
#include <sstream>

#include "common/error.h"
#include "daemon/service/log_format.h"

using namespace starling;
using Catch::Contains;

namespace {

std::string logged(const std::string& format, const std::string& message) {
    std::ostringstream out;
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
    spdlog::logger logger("test", sink);
    logger.set_formatter(log_formatter(format));
    logger.warn("{}", message);
    return out.str();
}

}  // namespace

TEST_CASE(
    "a JSON log line parses whatever the message holds, and a text line carries the UTC offset") {
    const std::string awkward =
        "a \"quoted\" path C:\\dir, a tab\t, a newline\nand a stray byte \xff";
    const std::string line = logged("json", awkward);
    REQUIRE(line.back() == '\n');
    REQUIRE(std::count(line.begin(), line.end(), '\n') == 1);  // the message's newline is escaped
    const nlohmann::json entry = nlohmann::json::parse(line);
    CHECK(entry.at("level") == "warning");
    CHECK(std::regex_match(entry.at("time").get<std::string>(),
                           std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}[+-]\d\d:\d\d)")));
    // Everything but the byte that is not UTF-8, which becomes U+FFFD.
    CHECK(entry.at("message") == awkward.substr(0, awkward.size() - 1) + "\xef\xbf\xbd");

    const std::string text = logged("text", "plain");
    CHECK(std::regex_match(
        text,
        std::regex(R"(\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} [+-]\d\d:\d\d\] warning plain\n)")));

    CHECK_THROWS_WITH(log_formatter("xml"), Contains("\"xml\" is not text or json"));
}
