#include "daemon/swarm/swarm_checkpoint.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "daemon/checkpoint_dir.h"

namespace starling {

namespace {

constexpr const char* kFormat = "starling-swarm-checkpoint/1";

std::string checksum_of(std::span<const std::byte> bytes) {
    return fmt::format("{:016x}", XXH3_64bits(bytes.data(), bytes.size()));
}

// Moves a checkpoint that does not read back into root/corrupt/<its name>[.N], the first free name;
// returns where it went, or "" (logged) when the move fails and it stays where it is.
std::filesystem::path move_aside(const std::filesystem::path& root,
                                 const std::filesystem::path& checkpoint) {
    const std::filesystem::path corrupt = root / "corrupt";
    std::error_code error;
    std::filesystem::create_directories(corrupt, error);
    std::filesystem::path target = corrupt / checkpoint.filename();
    for (int n = 1; !error && std::filesystem::exists(target); n++)
        target = corrupt / (checkpoint.filename().string() + "." + std::to_string(n));
    if (!error) std::filesystem::rename(checkpoint, target, error);
    if (!error) return target;
    spdlog::error("cannot move the corrupt checkpoint {} aside into {}: {}", checkpoint.string(),
                  corrupt.string(), error.message());
    return {};
}

}  // namespace

std::filesystem::path save_swarm_checkpoint(const std::filesystem::path& root, size_t keep,
                                            const std::string& fingerprint,
                                            const RoundStart& start) {
    const std::span<const std::byte> state = start.snapshot->bytes();
    const uint64_t round = start.snapshot->round();
    nlohmann::json meta = {{"format", kFormat},
                           {"fingerprint", fingerprint},
                           {"round", round},
                           {"data_epoch", start.data.epoch},
                           {"data_position", start.data.position},
                           {"state_bytes", state.size()},
                           {"state_xxh3", checksum_of(state)}};
    CheckpointDir dir(root, keep);
    return dir.save(round, [&](const std::filesystem::path& staging) {
        write_file_atomic(staging / "state.bin", state);
        write_file_atomic(staging / "checkpoint.json", meta.dump(2) + "\n");
    });
}

SwarmCheckpoint read_swarm_checkpoint(const std::filesystem::path& dir,
                                      const std::string& fingerprint) {
    const std::filesystem::path meta_path = dir / "checkpoint.json";
    nlohmann::json meta;
    try {
        meta = nlohmann::json::parse(read_file(meta_path));
    } catch (const nlohmann::json::exception& e) {
        throw Error(meta_path.string() + ": not valid JSON (" + e.what() + ")");
    }
    SwarmCheckpoint c;
    c.path = dir;
    std::string checksum;
    uint64_t size = 0;
    try {
        if (meta.at("format").get<std::string>() != kFormat)
            throw Error(meta_path.string() + ": format \"" + meta.at("format").get<std::string>() +
                        "\" is not " + kFormat);
        const std::string theirs = meta.at("fingerprint").get<std::string>();
        if (theirs != fingerprint)
            throw CheckpointOfAnotherModel(
                meta_path.string() + ": saved for model " + theirs +
                ", but the config's model is " + fingerprint +
                "; move the checkpoints away or use another [node].data_dir");
        c.round = meta.at("round").get<uint64_t>();
        c.data = {meta.at("data_epoch").get<uint64_t>(), meta.at("data_position").get<uint64_t>()};
        size = meta.at("state_bytes").get<uint64_t>();
        checksum = meta.at("state_xxh3").get<std::string>();
    } catch (const nlohmann::json::exception& e) {
        throw Error(meta_path.string() + ": " + e.what());
    }
    const std::filesystem::path state_path = dir / "state.bin";
    c.state = read_file_bytes(state_path);
    if (c.state.size() != size)
        throw Error(state_path.string() + ": " + std::to_string(c.state.size()) +
                    " bytes, checkpoint.json says " + std::to_string(size));
    if (checksum_of(c.state) != checksum)
        throw Error(state_path.string() +
                    ": checksum does not match checkpoint.json (the file is corrupt)");
    return c;
}

std::optional<SwarmCheckpoint> newest_swarm_checkpoint(const std::filesystem::path& root,
                                                       const std::string& fingerprint) {
    if (!std::filesystem::exists(root)) return std::nullopt;
    const auto all = CheckpointDir(root, 0).list();
    for (auto it = all.rbegin(); it != all.rend(); ++it) {
        try {
            return read_swarm_checkpoint(it->second, fingerprint);
        } catch (const CheckpointOfAnotherModel&) {
            throw;
        } catch (const Error& e) {
            const std::filesystem::path moved = move_aside(root, it->second);
            spdlog::warn("checkpoint {} skipped{}: {}", it->second.string(),
                         moved.empty() ? "" : " and moved to " + moved.string(), e.what());
        }
    }
    return std::nullopt;
}

}  // namespace starling
