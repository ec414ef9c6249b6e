// [node].training_nice: the round loop's thread runs nicer than the rest of the daemon.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <thread>

#include "daemon/service/node_runner.h"

using namespace starling;

namespace {

int this_thread_nice() {
    return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
}

}  // namespace

TEST_CASE("training_nice lowers the calling thread and the threads it starts, not the others") {
    const int process_before = this_thread_nice();
    int lowered = 0, started = 0;
    std::thread([&] {
        NodeRunner::lower_this_thread_priority(5);
        lowered = this_thread_nice();
        std::thread([&] { started = this_thread_nice(); }).join();
    }).join();
    CHECK(lowered == std::min(process_before + 5, 19));
    CHECK(started == lowered);
    CHECK(this_thread_nice() == process_before);
}

TEST_CASE("training_nice 0 leaves the thread as it is, and never goes past 19") {
    int unchanged = 0, capped = 0;
    const int before = this_thread_nice();
    std::thread([&] {
        NodeRunner::lower_this_thread_priority(0);
        unchanged = this_thread_nice();
        NodeRunner::lower_this_thread_priority(19);
        NodeRunner::lower_this_thread_priority(19);
        capped = this_thread_nice();
    }).join();
    CHECK(unchanged == before);
    CHECK(capped == 19);
}
