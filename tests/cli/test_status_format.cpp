#include <catch2/catch.hpp>

#include <cmath>
#include <fmt/format.h>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cli/status_format.h"

using namespace starling;
using namespace starling::cli;

namespace {

// Every field set, with values whose rendering the tests spell out.
v1::NodeStatus full_status() {
    v1::NodeStatus s;
    s.set_node_id("00112233aabbccdd");
    s.set_swarm_id("kjv-swarm");
    s.set_address("10.0.0.5:7700");
    s.set_reachability("private");
    s.set_reachability_detail("members could not dial this node's announced address 10.0.0.5:7700");
    s.add_anchors("1111222233334444");
    s.add_anchors("5555666677778888");
    s.set_phase(v1::NODE_PHASE_EXCHANGING);
    s.set_version("0.1.0");
    s.set_method("noloco");
    s.set_model_fingerprint("0f1e2d3c4b5a6978");
    s.set_device("cpu (2 threads)");
    s.set_round(42);
    s.set_inner_step(840);
    s.set_total_steps(10000);
    s.set_train_loss(1.23456);
    s.set_val_loss(1.5);
    s.set_tokens_per_second(95825.4);
    s.set_peers_alive(3);
    s.set_peers_suspect(1);
    s.set_last_partner("8899aabbccddeeff");
    s.set_rounds_paired(30);
    s.set_rounds_solo(12);
    s.set_bytes_sent(1536);
    s.set_bytes_received(3u << 20);
    s.set_compression_ratio(3.98);
    s.set_last_exchange_seconds(0.8412);
    s.set_partner_distance(0.00123456);
    s.set_checkpoint_age_seconds(185);
    s.set_checkpoint_round(40);
    s.set_uptime_seconds(7390);
    s.set_train_seconds(6651);
    s.set_last_failure("partner 8899aabbccddeeff timed out");
    s.set_eta_seconds(2 * 3600 + 13 * 60 + 5);
    for (double loss : {2.0, 1.9, 1.5, 1.2, 1.0}) s.add_recent_train_losses(loss);
    return s;
}

std::map<std::string, std::string> rows_by_label(const v1::NodeStatus& status) {
    std::map<std::string, std::string> out;
    for (const auto& row : status_rows(status)) {
        REQUIRE(row.size() == 2);
        REQUIRE(out.emplace(row[0], row[1]).second);  // labels are unique
    }
    return out;
}

std::vector<std::string> lines_of(const std::string& text) {
    std::vector<std::string> lines;
    std::istringstream in(text);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
}

}  // namespace

TEST_CASE("byte counts read in binary units with one decimal") {
    CHECK(human_bytes(0) == "0 B");
    CHECK(human_bytes(1023) == "1023 B");
    CHECK(human_bytes(1024) == "1.0 KiB");
    CHECK(human_bytes(1536) == "1.5 KiB");
    CHECK(human_bytes(1048575) == "1.0 MiB");  // not "1024.0 KiB"
    CHECK(human_bytes(5u << 20) == "5.0 MiB");
    CHECK(human_bytes((3ull << 30) + (1ull << 29)) == "3.5 GiB");
    CHECK(human_bytes(5ull << 40) == "5120.0 GiB");
}

TEST_CASE("durations show their two largest units") {
    CHECK(human_duration(0) == "0s");
    CHECK(human_duration(59.4) == "59s");
    CHECK(human_duration(61) == "1m 01s");
    CHECK(human_duration(3 * 3600 + 5 * 60 + 59) == "3h 05m");
    CHECK(human_duration(4 * 86400 + 7 * 3600) == "4d 07h");
    CHECK(human_duration(-3) == "0s");  // a clock step on the node, not a negative age
    CHECK(human_duration(NAN) == "-");
    CHECK(human_duration(INFINITY) == "-");
}

TEST_CASE("phases print as lower-case words, unknown ones by number") {
    CHECK(phase_name(v1::NODE_PHASE_TRAINING) == "training");
    CHECK(phase_name(v1::NODE_PHASE_DRAINING) == "draining");
    CHECK(phase_name(v1::NODE_PHASE_UNSPECIFIED) == "unspecified");
    CHECK(phase_name(static_cast<v1::NodePhase>(42)) == "phase 42");
}

TEST_CASE("columns are left-aligned two spaces apart with no trailing blanks") {
    CHECK(render_columns({{"a", "bb", "c"}, {"ccc", "d", "e"}}) == "a    bb  c\nccc  d   e\n");
    CHECK(render_columns({{"only"}, {"x", "y"}}) == "only\nx     y\n");
    CHECK(render_columns({}).empty());
}

TEST_CASE("the status table renders every field of a full status") {
    const auto rows = rows_by_label(full_status());
    const std::map<std::string, std::string> expected = {
        {"node", "00112233aabbccdd"},
        {"swarm", "kjv-swarm"},
        {"address", "10.0.0.5:7700"},
        {"reachable",
         "private: members could not dial this node's announced address 10.0.0.5:7700"},
        {"anchors", "1111222233334444, 5555666677778888"},
        {"phase", "exchanging"},
        {"method", "noloco"},
        {"device", "cpu (2 threads)"},
        {"version", "0.1.0"},
        {"model", "0f1e2d3c4b5a6978"},
        {"round", "42"},
        {"inner step", "840 / 10000"},
        {"eta", "2h 13m"},
        {"train loss", "1.2346"},
        {"val loss", "1.5000"},
        {"loss trend", "██▅▂▁ 2.0000 -> 1.0000 over 5 rounds"},
        {"tokens/s", "95825"},
        {"peers", "3 alive, 1 suspect"},
        {"last partner", "8899aabbccddeeff"},
        {"rounds", "30 paired, 12 solo"},
        {"bytes sent", "1.5 KiB"},
        {"bytes received", "3.0 MiB"},
        {"compression", "3.98x"},
        {"last exchange", "0.84 s"},
        {"partner distance", "0.00123"},
        {"checkpoint", "round 40, 3m 05s ago"},
        {"uptime", "2h 03m"},
        {"compute", "90.0% of uptime in inner steps"},
        {"last failure", "partner 8899aabbccddeeff timed out"},
    };
    CHECK(rows == expected);

    // Two columns: every value starts two spaces after the longest label.
    const auto lines = lines_of(format_status(full_status()));
    REQUIRE(lines.size() == expected.size());
    const size_t column = std::string("partner distance").size() + 2;
    for (const std::string& line : lines) {
        INFO(line);
        REQUIRE(line.size() > column);
        CHECK(line[column - 1] == ' ');
        CHECK(line[column] != ' ');
    }
    CHECK(lines.front() == "node              00112233aabbccdd");
}

TEST_CASE("absent optional fields show as a dash and no failure row appears") {
    v1::NodeStatus s = full_status();
    s.clear_train_loss();
    s.clear_val_loss();
    s.clear_partner_distance();
    s.clear_checkpoint_age_seconds();
    s.clear_last_partner();
    s.clear_last_failure();
    s.set_compression_ratio(0);  // before the first exchange
    s.set_last_exchange_seconds(0);
    s.clear_device();
    s.clear_eta_seconds();
    s.clear_recent_train_losses();
    s.add_recent_train_losses(2.0);  // one round is no trend yet
    s.clear_anchors();
    const auto rows = rows_by_label(s);
    for (const char* label :
         {"anchors", "train loss", "val loss", "partner distance", "checkpoint", "last partner",
          "compression", "last exchange", "device", "eta", "loss trend"}) {
        INFO(label);
        CHECK(rows.at(label) == "-");
    }
    CHECK(rows.count("last failure") == 0);
    s.set_anchored_members(3);
    CHECK(rows_by_label(s).at("anchors") == "anchor of 3 private members");
    s.set_relayed_exchanges(1);
    CHECK(rows_by_label(s).at("anchors") ==
          "anchor of 3 private members; relayed 1 exchange of private members");

    // A private node: its anchors, then its exchanges through a relay and over punched connections.
    v1::NodeStatus hidden;
    hidden.add_anchors("aaaaaaaaaaaaaaaa");
    hidden.set_exchanges_through_relay(2);
    hidden.set_hole_punches(3);
    hidden.set_failed_hole_punches(1);
    hidden.set_punched_exchanges(3);
    CHECK(rows_by_label(hidden).at("anchors") ==
          "aaaaaaaaaaaaaaaa; 2 exchanges through a relay; 3 exchanges over a punched connection, 3 "
          "of 4 hole punches connected");
}

TEST_CASE("the peers table has a header and one row per peer") {
    v1::ListPeersResponse peers;
    v1::PeerInfo* first = peers.add_peers();
    first->set_node_id("aaaaaaaaaaaaaaaa");
    first->set_address("10.0.0.7:7700");
    first->set_state("alive");
    first->set_reachability("public");
    first->set_round(41);
    first->set_compatible(true);
    first->set_rtt_ms(12.34);
    first->set_last_exchange_age_seconds(75);
    first->set_exchanges(9);
    v1::PeerInfo* second = peers.add_peers();
    second->set_node_id("bbbbbbbbbbbbbbbb");
    second->set_address("10.0.0.8:7700");
    second->set_state("suspect");
    second->set_round(40);
    v1::PeerInfo* third = peers.add_peers();
    third->set_node_id("cccccccccccccccc");
    third->set_address("10.0.0.9:7700");
    third->set_state("alive");
    third->set_reachability("private");
    third->set_round(41);
    third->set_compatible(true);
    third->set_refused_messages(3);
    third->set_quarantined_until_round(58);

    const auto lines = lines_of(format_peers(peers));
    REQUIRE(lines.size() == 4);
    CHECK(
        lines[0] ==
        "node              address        state                           reachable  round  compatible  "
        "rtt      last exchange  exchanges  refused");
    CHECK(
        lines[1] ==
        "aaaaaaaaaaaaaaaa  10.0.0.7:7700  alive                           public     41     yes         "
        "12.3 ms  1m 15s ago     9          0");
    CHECK(
        lines[2] ==
        "bbbbbbbbbbbbbbbb  10.0.0.8:7700  suspect                         -          40     no          "
        "-        -              0          0");
    CHECK(
        lines[3] ==
        "cccccccccccccccc  10.0.0.9:7700  alive, quarantined to round 58  private    41     yes         "
        "-        -              0          3");

    CHECK(format_peers(v1::ListPeersResponse()) == "no other members known\n");
}

TEST_CASE("the watch line carries round, phase, loss, peers, partner and ETA") {
    CHECK(
        format_status_line(full_status()) ==
        "round 42 | exchanging | loss 1.2346 | peers 3 alive, 1 suspect | partner 8899aabbccddeeff | eta 2h 13m");
    v1::NodeStatus starting;
    starting.set_phase(v1::NODE_PHASE_STARTING);
    CHECK(format_status_line(starting) ==
          "round 0 | starting | loss - | peers 0 alive, 0 suspect | partner - | eta -");
}

TEST_CASE("a sparkline spans the lowest to the highest value, by hand") {
    // (v - 1) / 2 * 8 levels: 0 -> 0, 0.25 -> 2, 0.5 -> 4, 0.99 -> 7, 1 -> 7 (capped).
    CHECK(sparkline({1.0, 1.5, 2.0, 2.98, 3.0}) == "▁▃▅██");
    CHECK(sparkline({4.0, 4.0}) == "▁▁");  // flat: all lowest
    CHECK(sparkline({1.0, NAN, 3.0}) == "▁!█");
    CHECK(sparkline({}).empty());
}

TEST_CASE("JSON carries every field under its .proto name, zeros included") {
    const auto* descriptor = v1::NodeStatus::descriptor();
    const std::string full = to_json(full_status());
    const std::string empty = to_json(v1::NodeStatus());
    for (int i = 0; i < descriptor->field_count(); ++i) {
        const auto* field = descriptor->field(i);
        const std::string key = "\"" + field->name() + "\":";
        INFO(key);
        CHECK(full.find(key) != std::string::npos);
        // An optional field the node did not set is left out: its absence is the answer.
        if (!field->has_presence()) CHECK(empty.find(key) != std::string::npos);
    }
    CHECK(full.find("\"phase\":\"NODE_PHASE_EXCHANGING\"") != std::string::npos);
    // 64-bit counters as numbers, for jq and scripts; doubles and strings as they were.
    const nlohmann::json parsed = nlohmann::json::parse(full);
    CHECK(parsed["round"] == full_status().round());
    CHECK(parsed["bytes_sent"] == full_status().bytes_sent());
    CHECK(parsed["round"].is_number_unsigned());
    CHECK(parsed["node_id"] == full_status().node_id());
    CHECK(full.find('\n') == std::string::npos);  // one line, for scripts

    v1::ListPeersResponse peers;
    peers.add_peers()->set_node_id("aaaaaaaaaaaaaaaa");
    const std::string peers_json = to_json(peers);
    for (const char* key : {"node_id", "address", "state", "round", "compatible", "exchanges"})
        CHECK(peers_json.find(fmt::format("\"{}\":", key)) != std::string::npos);
    CHECK(peers_json.find("\"exchanges\":0") !=
          std::string::npos);  // a number in a repeated message too
    CHECK(to_json(v1::ListPeersResponse()) == "{\"peers\":[]}");
}
