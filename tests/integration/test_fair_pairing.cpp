// Fair partner choice with real daemons (docs/spec.md section 4): a node slower than the rest,
// here one stopped half of the time in 20 ms slices (SIGSTOP and SIGCONT, as a busy box or a
// slower GPU would make it; the slices well within a round of 32 steps), still pairs in at least
// half of its rounds, and so do the others.
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <sstream>
#include <thread>

#include "tests/integration/daemon_harness.h"
#include "tests/support/files.h"

using namespace starling::test;
using namespace std::chrono_literals;

namespace {

const Environment kLongerRounds{{"STARLING_SWARM_INNER_STEPS", "32"}};

// Stops a process for `stopped` out of every `stopped + running` until destroyed, which leaves it
// running.
class Throttle {
public:
    Throttle(pid_t pid, std::chrono::milliseconds stopped, std::chrono::milliseconds running)
        : thread_([this, pid, stopped, running] {
              while (!done_.load()) {
                  kill(pid, SIGSTOP);
                  std::this_thread::sleep_for(stopped);
                  kill(pid, SIGCONT);
                  std::this_thread::sleep_for(running);
              }
          }) {}
    ~Throttle() {
        done_.store(true);
        thread_.join();
    }

private:
    std::atomic<bool> done_{false};
    std::thread thread_;
};

// Rounds the daemon logged, the first `warm_up` left out (joining, the first views).
std::vector<LoggedRound> rounds_after(const TestDaemon& daemon, size_t warm_up) {
    std::vector<LoggedRound> rounds = logged_rounds(daemon.log());
    rounds.erase(rounds.begin(),
                 rounds.begin() + static_cast<std::ptrdiff_t>(std::min(warm_up, rounds.size())));
    return rounds;
}

// Every daemon of `all`, once each slowed one has `rounds` rounds past its warm-up, paired in at
// least half of its own rounds, less one: a slowed node is asked first after each solo round, so
// it pairs at least every other round, and a count that starts or ends between two of them may
// be one short. The shares go to the test's output.
void check_each_pairs_half(std::vector<TestDaemon*> all, const std::vector<TestDaemon*>& slowed,
                           size_t rounds) {
    constexpr size_t kWarmUp = 4;
    for (TestDaemon* d : slowed)
        eventually(d->name() + " logs " + std::to_string(rounds) + " rounds", 600s,
                   [&] { return rounds_after(*d, kWarmUp).size() >= rounds; });
    std::ostringstream shares;
    std::vector<std::pair<size_t, size_t>> paired_of;  // paired rounds, rounds
    for (TestDaemon* d : all) {
        const auto logged = rounds_after(*d, kWarmUp);
        const auto paired = static_cast<size_t>(std::count_if(
            logged.begin(), logged.end(), [](const LoggedRound& r) { return r.paired; }));
        paired_of.emplace_back(paired, logged.size());
        shares << d->name() << " " << paired << "/" << logged.size() << "  ";
    }
    WARN("paired rounds per node: " << shares.str());
    INFO(daemon_log_tails());
    for (size_t i = 0; i < all.size(); i++) {
        INFO(all[i]->name() << " paired " << paired_of[i].first << " of " << paired_of[i].second
                            << " rounds");
        CHECK(2 * (paired_of[i].first + 1) >= paired_of[i].second);
    }
}

}  // namespace

TEST_CASE("three starlingd, one at half speed: each pairs in at least half of its rounds",
          "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path()), slow("slow", root.path());
    a.start({}, kLongerRounds);
    b.start({a.peer_address()}, kLongerRounds);
    slow.start({a.peer_address()}, kLongerRounds);
    Throttle throttle(slow.process().pid(), 20ms, 20ms);
    check_each_pairs_half({&a, &b, &slow}, {&slow}, 20);
}

TEST_CASE("five starlingd, two at half speed: each pairs in at least half of its rounds",
          "[integration]") {
    TempDir root;
    TestDaemon a("a", root.path()), b("b", root.path()), c("c", root.path());
    TestDaemon slow1("slow1", root.path()), slow2("slow2", root.path());
    a.start({}, kLongerRounds);
    for (TestDaemon* d : {&b, &c, &slow1, &slow2}) d->start({a.peer_address()}, kLongerRounds);
    Throttle throttle1(slow1.process().pid(), 20ms, 20ms);
    Throttle throttle2(slow2.process().pid(), 20ms, 20ms);
    check_each_pairs_half({&a, &b, &c, &slow1, &slow2}, {&slow1, &slow2}, 20);
}
