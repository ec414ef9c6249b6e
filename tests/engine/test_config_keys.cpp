// The config keys' declarations (engine/config_keys.h): ranges against hand-written cases, and the
// text and Markdown the tables are made of.
#include <catch2/catch.hpp>
#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "common/error.h"
#include "engine/config_keys.h"

using namespace starling;

TEST_CASE("a key range holds what it says and says it") {
    CHECK(at_least(1).holds(1));
    CHECK_FALSE(at_least(1).holds(0.999));
    CHECK(at_least(1).text() == "at least 1");
    CHECK(at_least(0).requirement() == "must not be negative");
    CHECK(at_least(10).requirement() == "must be at least 10");
    CHECK_FALSE(above(0).holds(0));
    CHECK(above(0).holds(1e-30));
    CHECK(above(0).requirement() == "must be above 0");
    CHECK(in_range(2, 64).holds(2));
    CHECK(in_range(2, 64).holds(64));
    CHECK_FALSE(in_range(2, 64).holds(65));
    CHECK(in_range(2, 64).text() == "in [2, 64]");
    CHECK(in_range_open_max(0, 1).holds(0));
    CHECK_FALSE(in_range_open_max(0, 1).holds(1));
    CHECK(in_range_open_max(0, 1).text() == "in [0, 1)");
    CHECK_FALSE(at_least(0).holds(std::numeric_limits<double>::quiet_NaN()));
    CHECK(KeyRange{}.any());
    CHECK(KeyRange{}.text().empty());
    CHECK(non_empty().text() == "not empty");
}

namespace {

struct Fields {
    int count = 3;
    float rate = 0.5f;
    std::string name = "a";
    bool on = true;
    std::chrono::milliseconds wait{1500};
    double link_bytes_per_s = 1.25e6;
    std::vector<std::string> list{"x:1", "y:2"};
};

template <class V>
void visit_fields(V& v, Fields& f) {
    v.section("s");
    v("count", f.count, "how many", at_least(1));
    v("rate", f.rate, "how fast", in_range_open_max(0, 1));
    v("name", f.name, "what", non_empty());
    v("on", f.on, "whether");
    v("wait_ms", Milliseconds{f.wait}, "how long", at_least(10));
    v("link_mbit", MegabitsPerSecond{f.link_bytes_per_s}, "how wide", above(0));
    v("list", f.list, "which");
    v.accepted("old", "another program's");
}

}  // namespace

TEST_CASE("the range checker names the first key out of range, in its own unit") {
    KeyRangeChecker check;
    Fields ok;
    visit_fields(check, ok);  // nothing thrown
    Fields zero_count;
    zero_count.count = 0;
    CHECK_THROWS_WITH(visit_fields(check, zero_count),
                      "config: [s].count must be at least 1, got 0");
    Fields short_wait;
    short_wait.wait = std::chrono::milliseconds(5);
    CHECK_THROWS_WITH(visit_fields(check, short_wait),
                      "config: [s].wait_ms must be at least 10, got 5");
    Fields no_link;
    no_link.link_bytes_per_s = 0;
    CHECK_THROWS_WITH(visit_fields(check, no_link), "config: [s].link_mbit must be above 0, got 0");
    Fields unnamed;
    unnamed.name.clear();
    CHECK_THROWS_WITH(visit_fields(check, unnamed), "config: [s].name must not be empty");
}

TEST_CASE("the describer shows values as TOML writes them, in the keys' own units") {
    KeyDescriber describe;
    Fields f;
    visit_fields(describe, f);
    REQUIRE(describe.keys.size() == 8);
    CHECK(describe.keys[0].default_value == "3");
    CHECK(describe.keys[1].default_value == "0.5");
    CHECK(describe.keys[2].default_value == "\"a\"");
    CHECK(describe.keys[3].default_value == "true");
    CHECK(describe.keys[4].default_value == "1500");
    CHECK(describe.keys[5].default_value == "10");  // 1.25e6 bytes/s is 10 Mbit/s
    CHECK(describe.keys[6].default_value == "[\"x:1\", \"y:2\"]");
    CHECK(describe.keys[7].default_value.empty());
    CHECK(describe.keys[4].range == "at least 10");

    CHECK(key_help(describe.keys, "s", "wait_ms") == "[s].wait_ms: how long (at least 10)");
    CHECK_THROWS_AS(key_help(describe.keys, "s", "missing"), Error);

    const std::string markdown = keys_as_markdown(describe.keys);
    CHECK(markdown.find("`[s]`\n\n| key | default | range | meaning |\n|---|---|---|---|\n"
                        "| `count` | `3` | at least 1 | how many |\n") == 0);
    CHECK(markdown.find("| `old` |  |  | another program's |") != std::string::npos);
    const std::string text = keys_as_text(describe.keys);
    CHECK(text.find("[s] count = 3") != std::string::npos);
    CHECK(text.find("how many (at least 1)\n") != std::string::npos);
}
