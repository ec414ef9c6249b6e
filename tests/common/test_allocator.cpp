// The daemon's malloc settings keep freed buffers for reuse; release_free_memory gives their
// pages back. Both change the whole process, so each check runs in a child of its own.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "common/allocator.h"
#include "tests/support/sanitizer.h"

using namespace starling;

namespace {

// RssAnon of /proc/self/status: the heap's resident pages among others; -1 if unreadable.
long resident_anonymous_kb() {
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);)
        if (line.rfind("RssAnon:", 0) == 0) return std::stol(line.substr(8));
    return -1;
}

// What the child found, as its exit status.
enum Outcome { Released = 0, SettingsRefused, NotKept, NothingReleased, TooLittleReleased };

Outcome free_and_release() {
    if (!keep_freed_buffers_for_reuse()) return SettingsRefused;
    constexpr size_t kBlock = 1 << 20;
    std::vector<char*> blocks;
    for (int i = 0; i < 64; i++) {
        blocks.push_back(static_cast<char*>(std::malloc(kBlock)));
        std::memset(blocks.back(), 1, kBlock);
    }
    // Allocated after the blocks, so that the freed ones lie inside the heap, not at its top.
    char* above = static_cast<char*>(std::malloc(4096));
    std::memset(above, 1, 4096);
    const long in_use = resident_anonymous_kb();
    for (char* block : blocks) std::free(block);
    const long freed = resident_anonymous_kb();
    if (freed < in_use - 8 * 1024) return NotKept;
    if (!release_free_memory()) return NothingReleased;
    const long released = resident_anonymous_kb();
    std::free(above);
    return released <= freed - 48 * 1024 ? Released : TooLittleReleased;
}

}  // namespace

TEST_CASE("freed buffers stay resident for reuse until release_free_memory gives them back") {
    if (test::kSanitizerAllocator) {
        WARN("skipped: the sanitizer's allocator replaces glibc's malloc and its settings");
        return;
    }
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) _exit(free_and_release());
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    // 2: glibc refused the settings; 3: 64 MiB freed went back at once; 4: malloc_trim found
    // nothing; 5: less than 48 of the 64 MiB went back.
    CHECK(WEXITSTATUS(status) == Released);
}
