// How `starling status`, `peers` and `watch` print what the Control API returns. Pure functions of
// the messages, so every field's rendering is unit-tested without a node.
#pragma once

#include <google/protobuf/message.h>

#include <cstdint>
#include <string>
#include <vector>

#include "starling/v1/control.pb.h"

namespace starling::cli {

// Shown for an optional field the node did not set.
inline constexpr const char* kAbsent = "-";

// 1023 -> "1023 B", 1536 -> "1.5 KiB", then MiB and GiB (GiB above that too).
std::string human_bytes(uint64_t bytes);
// A span of time in the largest two units that matter: "42s", "3m 05s", "2h 03m", "4d 07h".
std::string human_duration(double seconds);
// NODE_PHASE_TRAINING -> "training".
std::string phase_name(v1::NodePhase phase);

// Rows of cells, left-aligned in columns two spaces apart, one line each.
std::string render_columns(const std::vector<std::vector<std::string>>& rows);

// Every field of the status as (label, value), in the order the table shows them.
std::vector<std::vector<std::string>> status_rows(const v1::NodeStatus& status);
std::string format_status(const v1::NodeStatus& status);       // the two-column table
std::string format_peers(const v1::ListPeersResponse& peers);  // a header and a row per peer
// One line per update for logs and pipes: round, phase, loss, peers, partner.
std::string format_status_line(const v1::NodeStatus& status);

// The message as one line of JSON with every field, defaults included, under the .proto's names.
std::string to_json(const google::protobuf::Message& message);

// One block character per value, ▁ for the lowest to █ for the highest ("!" for one not finite).
std::string sparkline(const std::vector<double>& values);

}  // namespace starling::cli
