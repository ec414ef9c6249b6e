// starlingd's log lines: text for a terminal and the journal, or one JSON object per line for log
// shippers (Loki, Elasticsearch, CloudWatch) that would otherwise parse the text with a regex.
// Both carry the local time with its offset from UTC, so lines from machines in different time
// zones sort together.
//   text: [2026-11-25 11:53:57.123 +00:00] info message
//   json: {"time":"2026-11-25T11:53:57.123+00:00","level":"info","message":"message"}
#pragma once

#include <memory>
#include <spdlog/formatter.h>
#include <string>

namespace starling {

// "text" or "json"; throws starling::Error naming the value otherwise.
std::unique_ptr<spdlog::formatter> log_formatter(const std::string& format);

// Every logger's lines from now on.
void use_log_format(const std::string& format);

}  // namespace starling
