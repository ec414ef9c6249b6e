// What the swarm tests share: the node config (pico on the KJV, small enough that several nodes
// share two cores) and running a body on one thread per node.
#pragma once

#include <cstdint>
#include <exception>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "daemon/config.h"
#include "daemon/swarm/swarm_node.h"
#include "peer/local_cluster.h"
#include "tests/support/compare.h"
#include "tests/support/kjv.h"

namespace starling::test {

inline constexpr int kInnerSteps = 8;

// pico with short sequences and one thread per node, on real gRPC servers on 127.0.0.1
// (local_cluster_config: Pair calls 1 s, exchanges 3 s); the schedule lasts `rounds` rounds.
inline SwarmConfig pico_swarm(int rounds, codec::Codec state_codec = codec::Codec::BF16SR) {
    SwarmConfig c;
    c.train = load_train_config(std::string(STARLING_SOURCE_DIR) + "/configs/pico.toml");
    c.train.data.dir = kjv_dir();
    c.train.batch_size = 8;
    c.train.seq_len = 32;
    c.train.threads = 1;
    c.train.steps = static_cast<int64_t>(rounds) * kInnerSteps;
    c.train.schedule.warmup_steps = kInnerSteps;
    c.inner_steps = kInnerSteps;
    c.exchange.state_codec = state_codec;
    c.exchange.zstd = false;  // so the bytes on the wire follow from the plan alone
    c.peer = local_cluster_config();
    return c;
}

// Runs `body(i)` for every index on its own thread; an exception on any thread is rethrown here.
template <typename Body>
void on_threads(size_t count, Body body) {
    std::mutex mutex;
    std::exception_ptr failure;
    std::vector<std::thread> threads;
    for (size_t i = 0; i < count; i++) {
        threads.emplace_back([&, i] {
            try {
                body(i);
            } catch (...) {
                std::lock_guard lock(mutex);
                failure = std::current_exception();
            }
        });
    }
    for (auto& thread : threads) thread.join();
    if (failure) std::rethrow_exception(failure);
}

}  // namespace starling::test
