#include "daemon/service/log_format.h"

#include <nlohmann/json.hpp>
#include <spdlog/pattern_formatter.h>
#include <spdlog/spdlog.h>

#include "common/error.h"

namespace starling {

namespace {

// %* in a pattern: the message as a JSON string, quoted and escaped (bytes that are not UTF-8
// become U+FFFD rather than a line no parser reads).
class JsonMessage : public spdlog::custom_flag_formatter {
public:
    void format(const spdlog::details::log_msg& msg, const std::tm&,
                spdlog::memory_buf_t& dest) override {
        const std::string quoted =
            nlohmann::json(std::string(msg.payload.data(), msg.payload.size()))
                .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
        dest.append(quoted.data(), quoted.data() + quoted.size());
    }
    std::unique_ptr<custom_flag_formatter> clone() const override {
        return std::make_unique<JsonMessage>();
    }
};

}  // namespace

std::unique_ptr<spdlog::formatter> log_formatter(const std::string& format) {
    auto formatter = std::make_unique<spdlog::pattern_formatter>();
    if (format == "text") {
        formatter->set_pattern("[%Y-%m-%d %H:%M:%S.%e %z] %^%l%$ %v");
    } else if (format == "json") {
        formatter->add_flag<JsonMessage>('*').set_pattern(
            R"({"time":"%Y-%m-%dT%H:%M:%S.%e%z","level":"%l","message":%*})");
    } else {
        throw Error("log format \"" + format + "\" is not text or json");
    }
    return formatter;
}

void use_log_format(const std::string& format) { spdlog::set_formatter(log_formatter(format)); }

}  // namespace starling
