// Raw TCP throughput measured by iperf3: the baseline the exchange benchmark is compared with.
#pragma once

#include <cstdint>
#include <string>

namespace starling::bench {

// Medians of several iperf3 runs, in bits per second received.
struct TcpRates {
    double one_way = 0;  // one direction
    double bidir = 0;    // --bidir: both directions at once, summed
};

// Runs an iperf3 client against a server already listening at host:port: `reps` runs of one
// direction, then `reps` with --bidir, each `seconds` long. Throws starling::Error when iperf3
// is missing, cannot connect or reports an error.
TcpRates iperf3_rates(const std::string& host, uint16_t port, int seconds, int reps);

// The same on 127.0.0.1, against a one-shot server (`iperf3 -s -1`) spawned for each run.
TcpRates iperf3_loopback_rates(int seconds, int reps);

}  // namespace starling::bench
