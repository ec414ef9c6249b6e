// A swarm node's checkpoint: the state at the start of a round (daemon/swarm/swarm_node.h,
// RoundStart), kept under <data_dir>/checkpoints/step_%08d with the round as the step
// (daemon/checkpoint_dir.h writes it atomically). Two files:
//   state.bin        the snapshot bytes exactly as published to joiners (swarm_snapshot.h)
//   checkpoint.json  format, model fingerprint, round, the data position (epoch, position), the
//                    size of state.bin and its xxh3-64, so a torn or altered file is detected
//                    before a byte of it is used.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "daemon/swarm/swarm_node.h"

namespace starling {

struct SwarmCheckpoint {
    uint64_t round = 0;
    LoaderState data;
    std::vector<std::byte> state;  // snapshot bytes
    std::filesystem::path path;    // the directory it was read from
};

// Saves the node's round start; returns the checkpoint directory.
std::filesystem::path save_swarm_checkpoint(const std::filesystem::path& root, size_t keep,
                                            const std::string& fingerprint,
                                            const RoundStart& start);

// Reads one checkpoint directory; throws starling::Error naming the file and what is wrong
// (missing, another format or model, a size or checksum that does not match).
SwarmCheckpoint read_swarm_checkpoint(const std::filesystem::path& dir,
                                      const std::string& fingerprint);

// A checkpoint saved for another model: never skipped, since starting over would prune it.
class CheckpointOfAnotherModel : public Error {
public:
    using Error::Error;
};

// The newest checkpoint under root that reads back whole, or nullopt when there is none. Ones that
// do not (a corrupt file) are moved aside into root/corrupt/ (kept for a look, out of the way of
// pruning, which would otherwise keep them and delete the good checkpoints written after them)
// with a warning naming them and why; one of another model throws CheckpointOfAnotherModel.
std::optional<SwarmCheckpoint> newest_swarm_checkpoint(const std::filesystem::path& root,
                                                       const std::string& fingerprint);

}  // namespace starling
