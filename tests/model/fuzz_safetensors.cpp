// Fuzz target for the safetensors reader, which reads checkpoints and the snapshot a donor serves a
// joining node. scripts/fuzz builds this file into a libFuzzer binary; the model suite compiles it
// too and replays tests/model/safetensors-corpus through fuzz_safetensors_valid.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "model/safetensors.h"

// Parses one input as a whole file and reads every tensor as its own dtype; true when it was a
// valid file. Anything but a starling::Error escaping, or a sanitizer report, is a bug.
bool fuzz_safetensors_valid(const uint8_t* data, size_t size) {
    std::vector<std::byte> contents(size);
    if (size > 0) std::memcpy(contents.data(), data, size);
    try {
        const starling::SafetensorsFile file =
            starling::SafetensorsFile::parse(std::move(contents), "fuzz input");
        for (const starling::TensorEntry& t : file.tensors()) {
            // An entry's bytes lie inside the file and hold exactly its shape.
            if (t.bytes.size() != static_cast<size_t>(t.numel()) * starling::dtype_size(t.dtype))
                __builtin_trap();
            std::vector<std::byte> out(t.bytes.size());
            file.read(t.name, t.dtype, t.shape, out);
        }
        return true;
    } catch (const starling::Error&) {
        return false;
    }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    fuzz_safetensors_valid(data, size);
    return 0;
}
