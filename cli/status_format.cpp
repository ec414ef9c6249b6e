#include "cli/status_format.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace starling::cli {

namespace {

std::string or_absent(const std::string& text) { return text.empty() ? kAbsent : text; }

std::string fixed(double value, int digits) { return fmt::format("{:.{}f}", value, digits); }

// The proto's optional fields: has says whether the node set it.
std::string optional_fixed(bool has, double value, int digits) {
    return has ? fixed(value, digits) : kAbsent;
}

std::string age(bool has, double seconds) {
    return has ? human_duration(seconds) + " ago" : kAbsent;
}

// "▇▆▅▃▂▂▁ 1.9560 -> 1.4950 over 7 rounds": the last rounds' training losses, oldest first.
std::string loss_trend(const v1::NodeStatus& s) {
    const auto& losses = s.recent_train_losses();
    if (losses.size() < 2) return kAbsent;
    return fmt::format("{} {:.4f} -> {:.4f} over {} rounds",
                       sparkline({losses.begin(), losses.end()}), losses[0],
                       losses[losses.size() - 1], losses.size());
}

}  // namespace

std::string sparkline(const std::vector<double>& values) {
    static constexpr const char* kBars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
    double low = INFINITY, high = -INFINITY;
    for (double v : values) {
        if (!std::isfinite(v)) continue;
        low = std::min(low, v);
        high = std::max(high, v);
    }
    std::string out;
    for (double v : values) {
        if (!std::isfinite(v)) {
            out += "!";  // a diverged round stands out
            continue;
        }
        const double position = high > low ? (v - low) / (high - low) : 0.0;
        out += kBars[std::min<size_t>(7, static_cast<size_t>(position * 8.0))];
    }
    return out;
}

std::string human_bytes(uint64_t bytes) {
    if (bytes < 1024) return fmt::format("{} B", bytes);
    static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB"};
    double value = static_cast<double>(bytes) / 1024.0;
    size_t unit = 0;
    // 1023.95 and up would print as "1024.0": the next unit reads better.
    while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
        value /= 1024.0;
        ++unit;
    }
    return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

std::string human_duration(double seconds) {
    if (!std::isfinite(seconds)) return kAbsent;
    const auto total = static_cast<uint64_t>(std::llround(std::max(0.0, seconds)));
    if (total < 60) return fmt::format("{}s", total);
    if (total < 3600) return fmt::format("{}m {:02}s", total / 60, total % 60);
    if (total < 86400) return fmt::format("{}h {:02}m", total / 3600, total % 3600 / 60);
    return fmt::format("{}d {:02}h", total / 86400, total % 86400 / 3600);
}

std::string phase_name(v1::NodePhase phase) {
    std::string name = v1::NodePhase_Name(phase);
    if (name.empty()) return fmt::format("phase {}", static_cast<int>(phase));  // from a newer node
    constexpr std::string_view kPrefix = "NODE_PHASE_";
    if (name.rfind(kPrefix, 0) == 0) name.erase(0, kPrefix.size());
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    return name;
}

std::string render_columns(const std::vector<std::vector<std::string>>& rows) {
    std::vector<size_t> widths;
    for (const auto& row : rows) {
        if (widths.size() < row.size()) widths.resize(row.size(), 0);
        for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
    }
    std::string out;
    for (const auto& row : rows) {
        for (size_t i = 0; i < row.size(); ++i) {
            out += row[i];
            if (i + 1 < row.size()) out.append(widths[i] - row[i].size() + 2, ' ');
        }
        out += '\n';
    }
    return out;
}

// "public", or "private: why, and what to do"; "-" from a node too old to say.
std::string reachability_text(const v1::NodeStatus& s) {
    if (s.reachability().empty()) return kAbsent;
    if (s.reachability_detail().empty()) return s.reachability();
    return s.reachability() + ": " + s.reachability_detail();
}

std::string exchanges_text(uint64_t n) {
    return fmt::format("{} exchange{}", n, n == 1 ? "" : "s");
}

// A private node's anchors, or how many private members this one anchors, the exchanges that went
// through a relay, and the hole punches.
std::string anchors_text(const v1::NodeStatus& s) {
    std::vector<std::string> parts;
    if (!s.anchors().empty())
        parts.push_back(fmt::format("{}", fmt::join(s.anchors(), ", ")));
    else if (s.anchored_members() > 0)
        parts.push_back(fmt::format("anchor of {} private member{}", s.anchored_members(),
                                    s.anchored_members() == 1 ? "" : "s"));
    if (s.exchanges_through_relay() > 0)
        parts.push_back(exchanges_text(s.exchanges_through_relay()) + " through a relay");
    if (s.hole_punches() + s.failed_hole_punches() > 0)
        parts.push_back(fmt::format("{} over a punched connection, {} of {} hole punches connected",
                                    exchanges_text(s.punched_exchanges()), s.hole_punches(),
                                    s.hole_punches() + s.failed_hole_punches()));
    if (s.relayed_exchanges() > 0)
        parts.push_back("relayed " + exchanges_text(s.relayed_exchanges()) + " of private members");
    return parts.empty() ? kAbsent : fmt::format("{}", fmt::join(parts, "; "));
}

std::vector<std::vector<std::string>> status_rows(const v1::NodeStatus& s) {
    std::vector<std::vector<std::string>> rows = {
        {"node", or_absent(s.node_id())},
        {"swarm", or_absent(s.swarm_id())},
        {"address", or_absent(s.address())},
        {"reachable", reachability_text(s)},
        {"anchors", anchors_text(s)},
        {"phase", phase_name(s.phase())},
        {"method", or_absent(s.method())},
        {"device", or_absent(s.device())},
        {"version", or_absent(s.version())},
        {"model", or_absent(s.model_fingerprint())},
        {"round", std::to_string(s.round())},
        {"inner step", fmt::format("{} / {}", s.inner_step(), s.total_steps())},
        {"eta", s.has_eta_seconds() ? human_duration(s.eta_seconds()) : kAbsent},
        {"train loss", optional_fixed(s.has_train_loss(), s.train_loss(), 4)},
        {"val loss", optional_fixed(s.has_val_loss(), s.val_loss(), 4)},
        {"loss trend", loss_trend(s)},
        {"tokens/s", fixed(s.tokens_per_second(), 0)},
        {"peers", fmt::format("{} alive, {} suspect", s.peers_alive(), s.peers_suspect())},
        {"last partner", or_absent(s.last_partner())},  // empty: the last round was solo
        {"rounds", fmt::format("{} paired, {} solo", s.rounds_paired(), s.rounds_solo())},
        {"bytes sent", human_bytes(s.bytes_sent())},
        {"bytes received", human_bytes(s.bytes_received())},
        // Both are 0 until the first exchange, which no real exchange is.
        {"compression",
         s.compression_ratio() > 0 ? fixed(s.compression_ratio(), 2) + "x" : kAbsent},
        {"last exchange",
         s.last_exchange_seconds() > 0 ? fixed(s.last_exchange_seconds(), 2) + " s" : kAbsent},
        {"partner distance",
         s.has_partner_distance() ? fmt::format("{:.3g}", s.partner_distance()) : kAbsent},
        {"checkpoint", s.has_checkpoint_age_seconds()
                           ? fmt::format("round {}, {}", s.checkpoint_round(),
                                         age(true, s.checkpoint_age_seconds()))
                           : kAbsent},
        {"uptime", human_duration(s.uptime_seconds())},
        // Time in inner steps over uptime, start and state copies included.
        {"compute", s.uptime_seconds() > 0
                        ? fmt::format("{:.1f}% of uptime in inner steps",
                                      100.0 * s.train_seconds() / s.uptime_seconds())
                        : kAbsent},
    };
    if (s.method() == "diloco") rows.push_back({"last quorum", std::to_string(s.last_quorum())});
    if (!s.last_failure().empty()) rows.push_back({"last failure", s.last_failure()});
    return rows;
}

std::string format_status(const v1::NodeStatus& status) {
    return render_columns(status_rows(status));
}

std::string format_peers(const v1::ListPeersResponse& peers) {
    if (peers.peers().empty()) return "no other members known\n";
    std::vector<std::vector<std::string>> rows = {{"node", "address", "state", "reachable", "round",
                                                   "compatible", "rtt", "last exchange",
                                                   "exchanges", "refused"}};
    for (const v1::PeerInfo& p : peers.peers()) {
        const std::string state = p.has_quarantined_until_round()
                                      ? or_absent(p.state()) + ", quarantined to round " +
                                            std::to_string(p.quarantined_until_round())
                                      : or_absent(p.state());
        rows.push_back({or_absent(p.node_id()), or_absent(p.address()), state,
                        or_absent(p.reachability()), std::to_string(p.round()),
                        p.compatible() ? "yes" : "no",
                        p.has_rtt_ms() ? fixed(p.rtt_ms(), 1) + " ms" : kAbsent,
                        age(p.has_last_exchange_age_seconds(), p.last_exchange_age_seconds()),
                        std::to_string(p.exchanges()), std::to_string(p.refused_messages())});
    }
    return render_columns(rows);
}

std::string format_status_line(const v1::NodeStatus& s) {
    return fmt::format("round {} | {} | loss {} | peers {} alive, {} suspect | partner {} | eta {}",
                       s.round(), phase_name(s.phase()),
                       optional_fixed(s.has_train_loss(), s.train_loss(), 4), s.peers_alive(),
                       s.peers_suspect(), or_absent(s.last_partner()),
                       s.has_eta_seconds() ? human_duration(s.eta_seconds()) : kAbsent);
}

namespace {

// proto3's JSON mapping prints 64-bit integers as strings, for JavaScript, whose numbers lose them
// above 2^53. jq, Python and shell scripts want numbers, and these counters stay far below that.
void int64_as_numbers(nlohmann::ordered_json& json, const google::protobuf::Descriptor& type) {
    using Field = google::protobuf::FieldDescriptor;
    for (int i = 0; i < type.field_count(); ++i) {
        const Field* field = type.field(i);
        const auto it = json.find(field->name());
        if (it == json.end() || field->is_map()) continue;
        const auto convert = [&](nlohmann::ordered_json& value) {
            if (field->cpp_type() == Field::CPPTYPE_INT64 && value.is_string())
                value = std::stoll(value.get<std::string>());
            else if (field->cpp_type() == Field::CPPTYPE_UINT64 && value.is_string())
                value = std::stoull(value.get<std::string>());
            else if (field->cpp_type() == Field::CPPTYPE_MESSAGE && value.is_object())
                int64_as_numbers(value, *field->message_type());
        };
        if (field->is_repeated() && it->is_array()) {
            for (nlohmann::ordered_json& value : *it) convert(value);
        } else {
            convert(*it);
        }
    }
}

}  // namespace

std::string to_json(const google::protobuf::Message& message) {
    google::protobuf::util::JsonPrintOptions options;
    options.always_print_primitive_fields = true;  // scripts find every key, zeros included
    // Node_id, not nodeId: the names the .proto documents.
    options.preserve_proto_field_names = true;
    std::string text;
    const auto status = google::protobuf::util::MessageToJsonString(message, &text, options);
    if (!status.ok())
        throw Error("cannot print " + message.GetTypeName() + " as JSON: " + status.ToString());
    nlohmann::ordered_json json = nlohmann::ordered_json::parse(text);
    int64_as_numbers(json, *message.GetDescriptor());
    return json.dump();
}

}  // namespace starling::cli
