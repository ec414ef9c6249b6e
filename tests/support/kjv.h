// The real KJV corpus for end-to-end tests: shards prepared once per test process into a scratch
// directory that goes away when the process exits.
#pragma once

#include <filesystem>
#include <string>

#include "data/corpus.h"
#include "data/prepare.h"
#include "tests/support/files.h"

namespace starling::test {

inline const std::filesystem::path& scratch_root() {
    static const TempDir root;
    return root.path();
}

inline const std::string& kjv_dir() {
    static const std::string dir = [] {
        PrepareOptions options;
        options.out_dir = (scratch_root() / "kjv").string();
        prepare_shards(read_kjv_text(), options);
        return options.out_dir;
    }();
    return dir;
}

}  // namespace starling::test
