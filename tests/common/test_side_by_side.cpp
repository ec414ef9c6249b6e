// SideBySide (common/side_by_side.h): every slot's work runs at once, on the same threads from run
// to run, and a failure in any slot comes back to the caller only after every slot has finished.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/side_by_side.h"

using namespace starling;
using namespace std::chrono_literals;

TEST_CASE("every slot's work is in flight at the same time", "[side_by_side]") {
    constexpr size_t kSlots = 4;
    SideBySide side(kSlots);
    REQUIRE(side.slots() == kSlots);
    // Each slot waits, up to 10 s, for all the others to arrive: run in turn, the first would
    // give up and report that it was alone.
    std::mutex mutex;
    std::condition_variable arrived;
    size_t present = 0;
    std::vector<int> saw_everyone(kSlots, 0);
    side.run([&](size_t slot) {
        std::unique_lock lock(mutex);
        present++;
        arrived.notify_all();
        saw_everyone[slot] = arrived.wait_for(lock, 10s, [&] { return present == kSlots; }) ? 1 : 0;
    });
    CHECK(saw_everyone == std::vector<int>(kSlots, 1));
}

TEST_CASE("slot 0 runs on the caller and each other slot on its own thread, run after run",
          "[side_by_side]") {
    SideBySide side(3);
    std::vector<std::thread::id> first(3), second(3);
    side.run([&](size_t slot) { first[slot] = std::this_thread::get_id(); });
    side.run([&](size_t slot) { second[slot] = std::this_thread::get_id(); });
    CHECK(first[0] == std::this_thread::get_id());
    CHECK(first[1] != first[0]);
    CHECK(first[2] != first[0]);
    CHECK(first[1] != first[2]);
    CHECK(second == first);

    SideBySide alone(1);
    std::thread::id ran_on;
    alone.run([&](size_t slot) {
        CHECK(slot == 0);
        ran_on = std::this_thread::get_id();
    });
    CHECK(ran_on == std::this_thread::get_id());
}

TEST_CASE("a failing slot is reported after every slot finished, the lowest failing slot first",
          "[side_by_side]") {
    SideBySide side(4);
    std::atomic<int> finished{0};
    const auto work = [&](size_t slot) {
        if (slot == 3 || slot == 1)
            throw std::runtime_error("slot " + std::to_string(slot) + " failed");
        std::this_thread::sleep_for(50ms);  // still running when the failures happen
        finished++;
    };
    CHECK_THROWS_WITH(side.run(work), "slot 1 failed");
    CHECK(finished == 2);

    // The next run starts clean: no failure carried over.
    finished = 0;
    side.run([&](size_t) { finished++; });
    CHECK(finished == 4);
    // A failure on the caller's own slot comes back too.
    CHECK_THROWS_WITH(side.run([](size_t slot) {
        if (slot == 0) throw std::runtime_error("caller failed");
    }),
                      "caller failed");
}

TEST_CASE("many short runs in a row each run every slot once", "[side_by_side]") {
    SideBySide side(3);
    std::vector<std::atomic<int>> counts(3);
    for (int i = 0; i < 2000; i++) side.run([&](size_t slot) { counts[slot]++; });
    for (const std::atomic<int>& c : counts) CHECK(c == 2000);
}
