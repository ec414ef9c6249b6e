#include "engine/config_reader.h"

#include <spdlog/spdlog.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/errno_text.h"
#include "common/error.h"
#include "common/mutex.h"

extern char** environ;

namespace starling {

namespace {

struct ConsultedVariables {
    Mutex mutex;
    std::set<std::string> names ABSL_GUARDED_BY(mutex);
};

ConsultedVariables& consulted_variables() {
    static ConsultedVariables consulted;
    return consulted;
}

// STARLING_* variables read outside the config files.
constexpr std::string_view kOtherVariables[] = {"STARLING_CONTROL", "STARLING_EMULATED_DEVICES",
                                                "STARLING_EMULATION_ORDER"};

}  // namespace

void note_config_variable(const std::string& name) {
    ConsultedVariables& consulted = consulted_variables();
    const MutexLock lock(consulted.mutex);
    consulted.names.insert(name);
}

std::vector<std::string> unknown_starling_variables() {
    ConsultedVariables& consulted = consulted_variables();
    const MutexLock lock(consulted.mutex);
    std::vector<std::string> unknown;
    for (char** entry = environ; *entry != nullptr; entry++) {
        const std::string_view text(*entry);
        const std::string name(text.substr(0, text.find('=')));
        if (name.rfind("STARLING_", 0) != 0 || consulted.names.count(name)) continue;
        if (std::find(std::begin(kOtherVariables), std::end(kOtherVariables), name) !=
            std::end(kOtherVariables))
            continue;
        unknown.push_back(name);
    }
    std::sort(unknown.begin(), unknown.end());
    return unknown;
}

std::string config_variable_name(std::string_view section, std::string_view key) {
    std::string name = "STARLING_" + std::string(section) + "_" + std::string(key);
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return name;
}

void warn_unknown_starling_variables(const std::vector<KeyDescription>& also_known) {
    for (const std::string& name : unknown_starling_variables()) {
        if (std::any_of(also_known.begin(), also_known.end(), [&](const KeyDescription& k) {
                return config_variable_name(k.section, k.key) == name;
            }))
            continue;
        spdlog::warn(
            "environment variable {} is not a Starling setting and is ignored (a setting's variable "
            "is STARLING_<SECTION>_<KEY>, e.g. STARLING_TRAIN_STEPS)",
            name);
    }
}

toml::table parse_config_file(const std::string& path) {
    // toml++ says only "path:0:0: File could not be opened for reading"; the OS says why.
    if (std::FILE* file = std::fopen(path.c_str(), "r")) {
        std::fclose(file);
    } else {
        throw Error(errno == ENOENT
                        ? "config file '" + path + "' does not exist"
                        : "config file '" + path + "' cannot be read: " + errno_text(errno));
    }
    try {
        return toml::parse_file(path);
    } catch (const toml::parse_error& e) {
        const auto& where = e.source().begin;
        throw Error(path + ":" + std::to_string(where.line) + ":" + std::to_string(where.column) +
                    ": " + std::string(e.description()));
    }
}

namespace {

void check_config_sections(const std::string& path, const toml::table& root,
                           const std::vector<std::string>& known) {
    for (const auto& [key, node] : root) {
        const std::string name(key.str());
        if (std::find(known.begin(), known.end(), name) == known.end() || !node.is_table()) {
            std::string list;
            for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
            throw Error(path + ": unknown section [" + name + "] (known: " + list + ")");
        }
    }
}

TableReader config_section(const std::string& path, const toml::table& root, const char* name) {
    return TableReader(path, name, root[name].as_table());
}

}  // namespace

ConfigFileReader::ConfigFileReader(const std::string& path, std::vector<std::string> ignored)
    : path_(path), root_(parse_config_file(path)), known_(std::move(ignored)) {}

void ConfigFileReader::section(const char* name) {
    if (current_) current_->reject_unknown();
    section_ = name;
    known_.push_back(name);
    current_.emplace(config_section(path_, root_, name));
}

void ConfigFileReader::read(const char* key, std::filesystem::path& path) {
    std::string text = path.string();
    current_->read(key, text);
    path = text;
}

void ConfigFileReader::read(const char* key, Milliseconds& ms) {
    int64_t count = ms.value.count();
    current_->read(key, count);
    ms.value = std::chrono::milliseconds(count);
}

void ConfigFileReader::read(const char* key, MegabitsPerSecond& rate) {
    double mbit = rate.bytes_per_s * 8 / 1e6;
    current_->read(key, mbit);
    rate.bytes_per_s = mbit * 1e6 / 8;
}

void ConfigFileReader::finish() {
    if (current_) current_->reject_unknown();
    check_config_sections(path_, root_, known_);
}

}  // namespace starling
