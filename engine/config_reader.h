// Reading TOML config files: typed keys with clear errors, unknown keys refused, environment
// overrides. The engine's sections are read here; `starling train` (daemon/config.h), the
// experiment (experiment/experiment_config.h) and starlingd (daemon/swarm/node_config.h) add their
// own.
#pragma once

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <cstdlib>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <toml++/toml.h>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "engine/config.h"
#include "engine/config_keys.h"

namespace starling {

// Records that the config variable `name` (STARLING_<SECTION>_<KEY>) was consulted; every
// TableReader::read does, so the variables a loaded config knows are the ones recorded.
void note_config_variable(const std::string& name);
// The STARLING_* variables of this process's environment that no config read so far consulted
// and that no other part of Starling reads (STARLING_CONTROL, the emulator's): a misspelt
// override such as STARLING_TRAIN_STPES, which would otherwise be ignored without a word.
std::vector<std::string> unknown_starling_variables();
// The variable that overrides [section].key: STARLING_<SECTION>_<KEY>.
std::string config_variable_name(std::string_view section, std::string_view key);
// Logs a warning for each of unknown_starling_variables() but those of `also_known`: the keys of
// another program's config (starlingd's, say, for `starling train`), which a shell shared by both
// may set for it.
void warn_unknown_starling_variables(const std::vector<KeyDescription>& also_known = {});

// Reads typed keys out of one TOML table and remembers which were used, so leftovers can be
// reported as unknown. An environment variable STARLING_<SECTION>_<KEY> (e.g. STARLING_TRAIN_STEPS)
// overrides the file; its value is read as a TOML value (STARLING_PEER_SEEDS='["a:7700"]'), except
// for strings, taken as they are.
class TableReader {
public:
    TableReader(const std::string& file, const std::string& section, const toml::table* table)
        : file_(file), section_(section), table_(table) {}

    template <typename V>
    void read(const char* key, V& out) {
        known_.insert(key);
        if (const toml::node* node = table_ ? table_->get(key) : nullptr) {
            assign(*node, out, file_ + ": [" + section_ + "]." + key);
        }
        const std::string variable = environment_name(key);
        note_config_variable(variable);
        const char* value = std::getenv(variable.c_str());
        if (!value) return;
        const std::string where = "environment variable " + variable + "=" + value;
        if constexpr (std::is_same_v<V, std::string>) {
            out = value;
        } else {
            toml::table parsed;
            try {
                parsed = toml::parse("v = " + std::string(value));
            } catch (const toml::parse_error&) {
                throw Error(where + ": not a valid value");
            }
            assign(*parsed.get("v"), out, where);
        }
    }

    // Takes the key without reading it: a key of another program's that this one ignores.
    void accept(const char* key) { known_.insert(key); }

    void reject_unknown() const {
        if (!table_) return;
        for (const auto& [key, node] : *table_) {
            if (!known_.count(std::string(key.str()))) {
                std::string list;
                for (const std::string& k : known_) list += (list.empty() ? "" : ", ") + k;
                throw Error(file_ + ": unknown key [" + section_ + "]." + std::string(key.str()) +
                            " (known keys: " + list + ")");
            }
        }
    }

private:
    std::string environment_name(const char* key) const {
        return config_variable_name(section_, key);
    }

    template <typename V>
    static void assign(const toml::node& node, V& out, const std::string& where) {
        auto fail = [&](const char* problem) { throw Error(where + " " + problem); };
        if constexpr (std::is_same_v<V, bool>) {
            if (!node.is_boolean()) fail("must be true or false");
            out = node.as_boolean()->get();
        } else if constexpr (std::is_same_v<V, std::string>) {
            if (!node.is_string()) fail("must be a string");
            out = node.as_string()->get();
        } else if constexpr (std::is_same_v<V, std::vector<std::string>>) {
            const toml::array* array = node.as_array();
            if (!array) fail("must be an array of strings");
            std::vector<std::string> values;
            for (const toml::node& item : *array) {
                if (!item.is_string()) fail("must be an array of strings");
                values.push_back(item.as_string()->get());
            }
            out = std::move(values);
        } else if constexpr (std::is_same_v<V, std::vector<double>>) {
            const toml::array* array = node.as_array();
            if (!array) fail("must be an array of numbers");
            std::vector<double> values;
            for (const toml::node& item : *array) {
                if (!item.is_number()) fail("must be an array of numbers");
                values.push_back(item.value<double>().value());
            }
            out = std::move(values);
        } else if constexpr (std::is_floating_point_v<V>) {
            if (!node.is_number()) fail("must be a number");
            out = static_cast<V>(node.value<double>().value());
        } else {
            if (!node.is_integer()) fail("must be an integer");
            const int64_t v = node.as_integer()->get();
            if (v < static_cast<int64_t>(std::numeric_limits<V>::min()) ||
                (v > 0 && static_cast<uint64_t>(v) > std::numeric_limits<V>::max())) {
                fail("is out of range");
            }
            out = static_cast<V>(v);
        }
    }

    std::string file_, section_;
    const toml::table* table_;
    std::set<std::string> known_;
};

// Parses a TOML file; a syntax error names the file, line and column.
toml::table parse_config_file(const std::string& path);

// Reads the keys a visit declares (engine/config_keys.h) out of one config file: each section's
// keys through a TableReader, so wrong types, out-of-range integers and overrides are handled
// there. finish() then refuses a key no visit declared in a visited section, and a section that
// was neither visited nor named in `ignored` (another program's sections in a shared file).
class ConfigFileReader {
public:
    ConfigFileReader(const std::string& path, std::vector<std::string> ignored);

    void section(const char* name);
    template <typename Field>
    void operator()(const char* key, Field&& field, const char*, KeyRange = {}) {
        read(key, field);
    }
    void accepted(const char* key, const char*) { current_->accept(key); }
    void finish();

private:
    template <typename V>
    void read(const char* key, V& field) {
        current_->read(key, field);
    }
    // The wrappers by non-const reference, so they are better matches than the template above.
    void read(const char* key, std::filesystem::path& path);
    void read(const char* key, Milliseconds& ms);
    void read(const char* key, MegabitsPerSecond& rate);
    template <typename E>
    void read(const char* key, Named<E>& named) {
        std::string name(named.name_of(named.value));
        current_->read(key, name);
        try {
            named.value = named.from_name(name);
        } catch (const Error& e) {
            throw Error(path_ + ": [" + section_ + "]." + key + ": " + e.what());
        }
    }

    std::string path_;
    toml::table root_;
    std::vector<std::string> known_;
    std::string section_;
    std::optional<TableReader> current_;
};

// One program's config read from `path`: the keys `visit(reader, config)` declares, the sections
// in `ignored` skipped, anything else refused, then Config::validate(); every error names the
// file.
template <typename Config, typename Visit>
Config load_config_file(const std::string& path, Visit&& visit,
                        std::vector<std::string> ignored = {}) {
    ConfigFileReader reader(path, std::move(ignored));
    Config config;
    visit(reader, config);
    reader.finish();
    try {
        config.validate();
    } catch (const Error& err) {
        throw Error(path + ": " + err.what());
    }
    return config;
}

}  // namespace starling
