// Config files written from a program's key descriptions (engine/config_keys.h), and the
// descriptions compared key by key.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "engine/config_keys.h"

namespace starling::test {

// A TOML file holding every key the descriptions show a value for, at that value.
inline std::string toml_of(const std::vector<KeyDescription>& keys) {
    std::string text, section;
    for (const KeyDescription& k : keys) {
        if (k.default_value.empty()) continue;  // an accepted key: no value of its own
        if (k.section != section) {
            section = k.section;
            text += "\n[" + section + "]\n";
        }
        text += k.key + " = " + k.default_value + "\n";
    }
    return text;
}

// Every key has the same value in both.
inline void check_same_values(const std::vector<KeyDescription>& got,
                              const std::vector<KeyDescription>& want) {
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); i++) {
        INFO("[" << want[i].section << "] " << want[i].key);
        CHECK(got[i].section == want[i].section);
        CHECK(got[i].key == want[i].key);
        CHECK(got[i].default_value == want[i].default_value);
    }
}

}  // namespace starling::test
