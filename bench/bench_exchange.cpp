// Exchange throughput of the peer layer: two paired nodes swap a round's messages, a Q8 delta of
// a model (configs/124m.toml by default) each way at once on one Peer.Exchange stream, next to raw
// TCP on the same path measured by iperf3 in the same run. Two variants: end to end (encoded while
// sending, decoded into the arena on receipt, as the daemon does) and transport only (chunks
// encoded beforehand).
//   bench_exchange loopback [--reps 5]                 both nodes in this process, on 127.0.0.1
//   bench_exchange tcp --connect HOST:PORT --out FILE  iperf3 through a path, for node --baseline
//   bench_exchange node --listen ... --secret S ...    one node of two, one per process
//   bench_exchange relay --listen ... --secret S       a public member that relays the two nodes'
//                                                      exchange when neither can be dialed
// bench/exchange_wan runs the last two across an emulated wide-area link, bench/exchange_nat
// through NAT, firewalls and a relay.
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <tuple>

#include "bench/exchange_message.h"
#include "bench/iperf.h"
#include "bench/median.h"
#include "common/allocator.h"
#include "common/error.h"
#include "daemon/config.h"
#include "peer/address.h"
#include "peer/local_cluster.h"
#include "peer/message_signature.h"
#include "peer/pairing.h"
#include "peer/reachability.h"
#include "peer/round_messages.h"

using namespace starling;
using namespace starling::bench;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

constexpr Encoding kEncodings[] = {Encoding::WhileSending, Encoding::Beforehand};

struct Rep {
    uint64_t round = 0;
    double seconds = 0;
    double cpu_seconds = 0;  // this process's, all threads: on a shared machine, how much it got
    uint64_t bytes_sent = 0;
    uint64_t bytes_received = 0;
    // Pages the kernel had to map in: fresh buffers where reused ones would do
    // (common/allocator.h).
    long page_faults = 0;
};

struct ProcessUsage {
    double cpu_seconds = 0;
    long page_faults = 0;  // minor: pages mapped and zeroed on first touch
};

ProcessUsage process_usage() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    const auto seconds = [](const timeval& t) {
        return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6;
    };
    return {seconds(usage.ru_utime) + seconds(usage.ru_stime), usage.ru_minflt};
}

// Wall time of run(), and the CPU time and page faults it cost.
template <typename Run>
auto timed(Run&& run) {
    const auto start = Clock::now();
    const ProcessUsage before = process_usage();
    auto result = run();
    const ProcessUsage after = process_usage();
    return std::tuple{std::move(result),
                      std::chrono::duration<double>(Clock::now() - start).count(),
                      ProcessUsage{after.cpu_seconds - before.cpu_seconds,
                                   after.page_faults - before.page_faults}};
}

// Median time of one encoding's reps, and the goodput it gives.
struct Summary {
    double seconds = 0;
    double cpu_seconds = 0;
    double one_way_bps = 0;  // our message's bytes over the time
    double both_bps = 0;     // both messages' bytes over the time
};

Summary summarize(const std::vector<Rep>& reps) {
    std::vector<double> seconds, cpu_seconds;
    for (const Rep& rep : reps) {
        seconds.push_back(rep.seconds);
        cpu_seconds.push_back(rep.cpu_seconds);
    }
    Summary summary;
    summary.seconds = median(seconds);
    summary.cpu_seconds = median(cpu_seconds);
    const Rep& any = reps.front();  // every round's messages have the same size
    summary.one_way_bps = 8.0 * any.bytes_sent / summary.seconds;
    summary.both_bps = 8.0 * (any.bytes_sent + any.bytes_received) / summary.seconds;
    return summary;
}

double gbit(double bps) { return bps / 1e9; }

void print_rep(const char* label, const Rep& rep) {
    std::printf(
        "  %-8s round %-3llu %7.3f s (cpu %5.2f s, %6ld page faults)  %6.2f Gbit/s each way  %6.2f Gbit/s both\n",
        label, static_cast<unsigned long long>(rep.round), rep.seconds, rep.cpu_seconds,
        rep.page_faults, gbit(8.0 * rep.bytes_sent / rep.seconds),
        gbit(8.0 * (rep.bytes_sent + rep.bytes_received) / rep.seconds));
}

// The median line, with each goodput as a share of the same run's baselines where there are any.
void print_summary(const Summary& s, const std::optional<TcpRates>& tcp, double link_bps) {
    std::printf("  median   %7.3f s (cpu %5.2f s): %.2f Gbit/s each way", s.seconds, s.cpu_seconds,
                gbit(s.one_way_bps));
    if (tcp) std::printf(" (%.0f%% of iperf3 one direction)", 100 * s.one_way_bps / tcp->one_way);
    if (link_bps > 0) std::printf(" (%.0f%% of the link's rate)", 100 * s.one_way_bps / link_bps);
    std::printf(", %.2f Gbit/s both", gbit(s.both_bps));
    if (tcp) std::printf(" (%.0f%% of iperf3 --bidir)", 100 * s.both_bps / tcp->bidir);
    std::printf("\n");
}

std::string iperf3_runs(int seconds, int reps) {
    return "iperf3, " + std::to_string(seconds) + " s runs, median of " + std::to_string(reps);
}

void print_tcp(const std::string& what, const TcpRates& tcp) {
    std::printf("raw TCP %s: one direction %.2f Gbit/s, --bidir %.2f Gbit/s (both summed)\n",
                what.c_str(), gbit(tcp.one_way), gbit(tcp.bidir));
}

void print_message(const DeltaModel& model) {
    const codec::MessageEncoder encoder(model.plan, {0, 0, 0}, model.delta.data(), nullptr, false);
    const size_t bytes = codec::kHeaderBytes + encoder.chunk_count() * codec::kChunkHeaderBytes +
                         codec::encoded_bytes(codec::Codec::Q8, model.manifest.total());
    std::printf(
        "Q8 delta: %zu parameters, %.1f MB each way (header and %u chunks of up to %zu MiB)\n",
        model.manifest.total(), bytes / 1e6, encoder.chunk_count(), codec::kMaxChunkBytes >> 20);
}

void write_json(const std::string& path, const nlohmann::json& doc) {
    std::ofstream file(path);
    file << doc.dump(2) << "\n";
    if (!file) throw Error("cannot write " + path);
}

void check(const ExchangeResult& result, const char* side) {
    if (!result.received || !result.delivered) throw Error(std::string(side) + ": " + result.error);
}

// Every rep's line as it comes, the warm-up (rep 0: connection set-up, window growth) apart from
// the median.
std::vector<Rep> run_reps(Encoding encoding, int reps, const std::function<Rep()>& run_one) {
    std::printf("\nexchange, %s:\n", encoding_name(encoding));
    std::vector<Rep> counted;
    for (int rep = 0; rep <= reps; ++rep) {
        const Rep figures = run_one();
        print_rep(rep == 0 ? "warm-up" : ("rep " + std::to_string(rep)).c_str(), figures);
        std::fflush(stdout);
        if (rep > 0) counted.push_back(figures);
    }
    return counted;
}

// --- loopback -----------------------------------------------------------------------------------

PeerConfig loopback_config(const DeltaModel& model) {
    PeerConfig config = local_cluster_config();
    config.fingerprint = model.manifest.fingerprint();
    config.exchange_timeout = 120s;
    // Exchanges keep both cores busy; a probe must not take a busy node for a dead one.
    config.probe_timeout = 1000ms;
    config.membership.suspicion_timeout = 10s;
    return config;
}

template <typename Done>
void wait_until(const char* what, std::chrono::seconds limit, Done done) {
    const auto until = Clock::now() + limit;
    while (!done()) {
        if (Clock::now() > until)
            throw Error(std::string(what) + ": not within " + std::to_string(limit.count()) + " s");
        std::this_thread::sleep_for(20ms);
    }
}

void pair_both(PeerNode& a, PeerNode& b, uint64_t round) {
    std::optional<Member> partner_of_b;
    std::thread other([&] { partner_of_b = b.rounds().choose_partner(round); });
    const auto partner_of_a = a.rounds().choose_partner(round);
    other.join();
    if (!partner_of_a || !partner_of_b || partner_of_a->node_id != b.node_id() ||
        partner_of_b->node_id != a.node_id())
        throw Error("round " + std::to_string(round) +
                    ": the two nodes did not pair with each other");
}

int loopback(const ModelConfig& shape, int reps, int tcp_seconds, int tcp_reps) {
    const DeltaModel model(shape);
    print_message(model);
    const TcpRates tcp = iperf3_loopback_rates(tcp_seconds, tcp_reps);
    print_tcp("on 127.0.0.1 (" + iperf3_runs(tcp_seconds, tcp_reps) + ")", tcp);

    LocalCluster cluster(2, loopback_config(model));
    PeerNode& a = cluster.node(0);
    PeerNode& b = cluster.node(1);
    wait_until("the two nodes seeing each other", 10s,
               [&] { return a.pairable_ids().size() == 2 && b.pairable_ids().size() == 2; });
    std::vector<float> received_a(model.manifest.total()), received_b(model.manifest.total());
    uint64_t round = 0;
    for (Encoding encoding : kEncodings) {
        const auto counted = run_reps(encoding, reps, [&] {
            pair_both(a, b, ++round);
            RoundMessages at_a(model, a.node_id(), b.node_id(), round, encoding, received_a);
            RoundMessages at_b(model, b.node_id(), a.node_id(), round, encoding, received_b);
            const auto [results, seconds, usage] = timed([&] {
                ExchangeResult result_b;
                std::thread other([&] { result_b = b.rounds().exchange(at_b.slot()); });
                ExchangeResult result_a = a.rounds().exchange(at_a.slot());
                other.join();
                return std::pair{std::move(result_a), std::move(result_b)};
            });
            check(results.first, "node a");
            check(results.second, "node b");
            return Rep{round,
                       seconds,
                       usage.cpu_seconds,
                       results.first.bytes_sent,
                       results.first.bytes_received,
                       usage.page_faults};
        });
        print_summary(summarize(counted), tcp, 0);
    }
    std::printf("\ntarget: exchange goodput at least 70%% of raw TCP on loopback\n");
    return 0;
}

// --- tcp: the baseline of a path, for node --baseline --------------------------------------------

int tcp(const std::string& connect, int seconds, int reps, const std::string& out) {
    const auto at = parse_host_port(connect);
    if (!at) throw Error("--connect must be host:port, not '" + connect + "'");
    const TcpRates rates = iperf3_rates(at->host, at->port, seconds, reps);
    print_tcp("to " + connect + " (" + iperf3_runs(seconds, reps) + ")", rates);
    write_json(out, {{"one_way_bps", rates.one_way}, {"bidir_bps", rates.bidir}});
    return 0;
}

// --- node: one of two processes ------------------------------------------------------------------

struct NodeOptions {
    std::string listen, announce, secret, out, baseline;
    std::vector<std::string> seeds;
    int reps = 5;
    double link_gbit = 0;
    int wait_s = 60;
    bool no_hole_punch = false;  // two private nodes exchange through the relay at once
};

std::optional<TcpRates> read_baseline(const std::string& path) {
    if (path.empty()) return std::nullopt;
    std::ifstream in(path);
    const auto doc = nlohmann::json::parse(in, nullptr, false);
    if (doc.is_discarded() || !doc.contains("one_way_bps") || !doc.contains("bidir_bps"))
        throw Error("--baseline " + path + ": not a file written by bench_exchange tcp");
    return TcpRates{doc["one_way_bps"].get<double>(), doc["bidir_bps"].get<double>()};
}

// Pairs with `partner` for `round`, or for the next round after a choice that went solo, as a
// daemon's next round would: a member that chose for a round is done with it in the others' views
// (done_with), so asking for the same round again pairs with nobody. Both processes go solo in
// the same rounds (a pairing is mutual), so they stay in step while the other catches up (a late
// start, a suspicion before its reachability was known). Returns the round they paired for.
uint64_t pair_with(PeerNode& node, uint64_t partner, uint64_t round, std::chrono::seconds limit) {
    const uint64_t first = round;
    wait_until(("pairing from round " + std::to_string(first)).c_str(), limit, [&] {
        const auto chosen = node.rounds().choose_partner(round);
        if (chosen && chosen->node_id != partner)
            throw Error("round " + std::to_string(round) + ": paired with an unexpected node " +
                        format_node_id(chosen->node_id));
        if (!chosen) round++;
        return chosen.has_value();
    });
    return round;
}

// A bench process's node: `options`' addresses and secret, exchanges of up to two minutes.
PeerConfig bench_node_config(const NodeOptions& options, std::string fingerprint) {
    PeerConfig config;
    config.listen = options.listen;
    config.announce = options.announce;
    config.seeds = options.seeds;
    config.swarm_id = "bench-exchange";
    config.swarm_secret = options.secret;
    config.fingerprint = std::move(fingerprint);
    config.exchange_timeout = 120s;
    config.hole_punch = !options.no_hole_punch;
    return config;
}

int node(const ModelConfig& shape, const NodeOptions& options) {
    const auto baseline = read_baseline(options.baseline);
    const DeltaModel model(shape);
    PeerNode node(bench_node_config(options, model.manifest.fingerprint()));
    node.start();
    const std::chrono::seconds wait(options.wait_s);
    wait_until("a second node joining", wait, [&] { return node.pairable_ids().size() == 2; });
    const auto ids = node.pairable_ids();
    const uint64_t partner = ids[0] == node.node_id() ? ids[1] : ids[0];
    // Which side opens the stream follows from the verdicts (a private node opens: connection
    // reversal), so the rounds wait for them: both public, or one private with the anchor through
    // which a proposal reaches it (the other may then stay unknown: only a member that is not
    // private can dial it back, and there is none).
    // Beside a relay (a third member, of no model), both nodes must have theirs: two private
    // nodes exchange through it, and one still unknown would be dialed at its address.
    wait_until("both nodes' reachability", wait, [&] {
        const auto seen = node.members();
        const auto is = [](Reachability r) {
            return [r](const Member& m) { return m.reachability == r; };
        };
        const auto decided = [&](const Member& m) {
            return is(Reachability::Public)(m) ||
                   (is(Reachability::Private)(m) && !m.anchors.empty());
        };
        if (seen.size() > 2)
            return std::all_of(seen.begin(), seen.end(), [&](const Member& m) {
                return decided(m) || (m.node_id != node.node_id() && m.node_id != partner);
            });
        return std::all_of(seen.begin(), seen.end(), is(Reachability::Public)) ||
               std::any_of(seen.begin(), seen.end(), [&](const Member& m) {
                   return is(Reachability::Private)(m) && !m.anchors.empty();
               });
    });
    const std::vector<Member> seen = node.members();
    const Member& self = seen.front();
    const auto other = std::find_if(seen.begin(), seen.end(),
                                    [&](const Member& m) { return m.node_id == partner; });
    if (other == seen.end()) throw Error("node " + format_node_id(partner) + " left");
    const char* stream =
        !needs_relay(self, *other)
            ? (opens_exchange(self, *other) ? "opens the stream" : "answers the stream")
        : options.no_hole_punch ? "through a relay"
                                : "punches, else through a relay";
    std::printf("node %s (%s, %s) with node %s (%s)\n", format_node_id(node.node_id()).c_str(),
                reachability_name(self.reachability), stream, format_node_id(partner).c_str(),
                reachability_name(other->reachability));
    print_message(model);
    if (baseline) print_tcp("on this path (" + options.baseline + ")", *baseline);

    std::vector<float> received(model.manifest.total());
    nlohmann::json report{{"node", format_node_id(node.node_id())},
                          {"partner", format_node_id(partner)}};
    uint64_t round = 0;
    for (Encoding encoding : kEncodings) {
        const auto counted = run_reps(encoding, options.reps, [&] {
            // Made before pairing, so neither side encodes while the other waits; again for a
            // later round where the choices went solo.
            auto messages = std::make_unique<RoundMessages>(model, node.node_id(), partner, ++round,
                                                            encoding, received);
            if (const uint64_t paired = pair_with(node, partner, round, wait); paired != round) {
                round = paired;
                messages = std::make_unique<RoundMessages>(model, node.node_id(), partner, round,
                                                           encoding, received);
            }
            const auto [result, seconds, usage] =
                timed([&] { return node.rounds().exchange(messages->slot()); });
            check(result, "this node");
            return Rep{round,
                       seconds,
                       usage.cpu_seconds,
                       result.bytes_sent,
                       result.bytes_received,
                       usage.page_faults};
        });
        const Summary summary = summarize(counted);
        print_summary(summary, baseline, options.link_gbit * 1e9);
        nlohmann::json reps = nlohmann::json::array();
        for (const Rep& rep : counted)
            reps.push_back({{"round", rep.round},
                            {"seconds", rep.seconds},
                            {"cpu_seconds", rep.cpu_seconds},
                            {"page_faults", rep.page_faults},
                            {"bytes_sent", rep.bytes_sent},
                            {"bytes_received", rep.bytes_received}});
        report[encoding_name(encoding)] = {{"reps", reps},
                                           {"median_seconds", summary.seconds},
                                           {"median_cpu_seconds", summary.cpu_seconds},
                                           {"one_way_bps", summary.one_way_bps},
                                           {"both_bps", summary.both_bps}};
    }
    const RoundPeers& rounds = node.rounds();
    std::printf(
        "hole punches: %llu connected, %llu failed; exchanges over a punched connection %llu, "
        "through a relay %llu\n",
        static_cast<unsigned long long>(rounds.hole_punches()),
        static_cast<unsigned long long>(rounds.failed_hole_punches()),
        static_cast<unsigned long long>(rounds.punched_exchanges()),
        static_cast<unsigned long long>(rounds.exchanges_through_relay()));
    report["hole_punches"] = rounds.hole_punches();
    report["failed_hole_punches"] = rounds.failed_hole_punches();
    report["punched_exchanges"] = rounds.punched_exchanges();
    report["exchanges_through_relay"] = rounds.exchanges_through_relay();
    if (!options.out.empty()) write_json(options.out, report);
    // The partner may still be reading our last receipt: leave once it has surely arrived.
    std::this_thread::sleep_for(2s);
    node.leave();
    return 0;
}

// --- relay: a public member of no model, whose relay the two nodes' exchange goes through -------

std::atomic<bool> relay_stopping{false};

int relay(const NodeOptions& options, double relay_mbit) {
    // Of no model, so never paired: the two nodes pair with each other.
    PeerConfig config = bench_node_config(options, "relay only");
    config.relay_bytes_per_s = relay_mbit * 125000;
    PeerNode node(config);
    node.start();
    std::signal(SIGTERM, [](int) { relay_stopping = true; });
    std::signal(SIGINT, [](int) { relay_stopping = true; });
    const auto started = Clock::now();
    while (!relay_stopping && Clock::now() - started < std::chrono::seconds(options.wait_s))
        std::this_thread::sleep_for(100ms);
    std::printf("relay %s: %llu exchanges relayed, %.1f MB passed on\n",
                format_node_id(node.node_id()).c_str(),
                static_cast<unsigned long long>(node.relayed_exchanges()),
                static_cast<double>(node.relayed_bytes()) / 1e6);
    if (!options.out.empty())
        write_json(options.out, {{"node", format_node_id(node.node_id())},
                                 {"relayed_exchanges", node.relayed_exchanges()},
                                 {"relayed_bytes", node.relayed_bytes()}});
    node.leave();
    return 0;
}

// What signing costs a side against the coding it does anyway, on one thread as the exchange's
// writer and reader each do: encoding the message, decoding it, and its signature made (digest
// and sign) and checked (digest and verify). Medians of `reps`.
int signature(const ModelConfig& shape, int reps) {
    const DeltaModel model(shape);
    print_message(model);
    const codec::SerialCoding serial;
    const NodeIdentity author = NodeIdentity::generate();
    std::vector<float> received(model.manifest.total());
    std::vector<double> encode_s, decode_s, sign_s, verify_s;
    const auto seconds = [](auto&& step) {
        const auto start = Clock::now();
        step();
        return std::chrono::duration<double>(Clock::now() - start).count();
    };
    for (int rep = 0; rep < reps; rep++) {
        codec::MessageEncoder encoder(model.plan, {author.node_id(), 1, 0}, model.delta.data(),
                                      nullptr, false);
        codec::EncodedMessage message;
        encode_s.push_back(seconds([&] { message = codec::encode_to_end(encoder); }));
        codec::MessageDecoder decoder(model.manifest.fingerprint(), model.manifest, received.data(),
                                      received.size());
        decode_s.push_back(
            seconds([&] { codec::decode_to_end(message.header, message.chunks, decoder); }));
        Signature signed_once{};
        sign_s.push_back(seconds([&] { signed_once = sign_round_message(author, 1, message, 0); }));
        bool verified = false;
        verify_s.push_back(seconds([&] {
            MessageDigest digest(author.node_id(), 1, 0, 0);
            digest.add(message.header);
            for (const auto& chunk : message.chunks) digest.add(chunk);
            verified = digest.verify(author.public_key(), signed_once);
        }));
        if (!verified) throw Error("the message's own signature did not verify");
    }
    const double encode = median(encode_s), decode = median(decode_s);
    const double sign = median(sign_s), verify = median(verify_s);
    std::printf(
        "one thread, median of %d: encode %.3f s, decode %.3f s; signature made %.3f s "
        "(%.1f%% of encoding), checked %.3f s (%.1f%% of decoding)\n",
        reps, encode, decode, sign, 100.0 * sign / encode, verify, 100.0 * verify / decode);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    if (!keep_freed_buffers_for_reuse())
        std::fprintf(stderr, "bench_exchange: malloc refused starlingd's settings\n");
    CLI::App app{"bench_exchange: the peer layer's exchange goodput against raw TCP"};
    app.require_subcommand(1);
    std::string config_path = "configs/124m.toml";
    app.add_option("--config", config_path, "the model whose Q8 delta is exchanged")
        ->capture_default_str();
    int reps = 5, tcp_seconds = 5, tcp_reps = 3;
    CLI::App* loopback_cmd =
        app.add_subcommand("loopback", "two nodes in this process on 127.0.0.1");
    loopback_cmd
        ->add_option("--reps", reps, "exchanges per variant after a warm-up (median reported)")
        ->capture_default_str();
    loopback_cmd->add_option("--tcp-seconds", tcp_seconds, "length of each iperf3 run")
        ->capture_default_str();
    loopback_cmd->add_option("--tcp-reps", tcp_reps, "iperf3 runs per mode (median reported)")
        ->capture_default_str();

    CLI::App* signature_cmd = app.add_subcommand(
        "signature", "what signing and checking a message costs beside coding it");
    signature_cmd->add_option("--reps", reps, "messages signed and checked (median reported)")
        ->capture_default_str();

    std::string connect, tcp_out;
    CLI::App* tcp_cmd =
        app.add_subcommand("tcp", "iperf3 client runs against a listening iperf3 server");
    tcp_cmd->add_option("--connect", connect, "host:port of the server (or of a relay to it)")
        ->required();
    tcp_cmd->add_option("--out", tcp_out, "where to write the medians, for node --baseline")
        ->required();
    tcp_cmd->add_option("--seconds", tcp_seconds, "length of each run")->capture_default_str();
    tcp_cmd->add_option("--reps", tcp_reps, "runs per mode (median reported)")
        ->capture_default_str();

    NodeOptions node_options;
    CLI::App* node_cmd = app.add_subcommand("node", "one node of two, one per process");
    node_cmd->add_option("--listen", node_options.listen, "host:port to serve on")->required();
    node_cmd->add_option("--announce", node_options.announce,
                         "host:port the other node dials to reach this one");
    node_cmd->add_option("--seed", node_options.seeds,
                         "host:port of the other node, for the one started second");
    node_cmd->add_option("--secret", node_options.secret, "swarm secret, the same on both")
        ->required();
    node_cmd->add_option("--reps", node_options.reps, "exchanges per variant after a warm-up")
        ->capture_default_str();
    node_cmd->add_option("--out", node_options.out, "where to write the figures (JSON)");
    node_cmd->add_flag("--no-hole-punch", node_options.no_hole_punch,
                       "two private nodes exchange through the relay without trying to punch");
    node_cmd->add_option("--baseline", node_options.baseline,
                         "medians written by bench_exchange tcp on this path");
    node_cmd->add_option("--link-gbit", node_options.link_gbit,
                         "the link's rate each way, to report goodput against");
    node_cmd
        ->add_option("--wait-s", node_options.wait_s,
                     "longest wait for the other node, and to pair")
        ->capture_default_str();
    NodeOptions relay_options;
    double relay_mbit = 10000;
    CLI::App* relay_cmd = app.add_subcommand(
        "relay", "a public member of no model, through which two private nodes exchange");
    relay_cmd->add_option("--listen", relay_options.listen, "host:port to serve on")->required();
    relay_cmd->add_option("--announce", relay_options.announce, "host:port the nodes dial");
    relay_cmd->add_option("--secret", relay_options.secret, "swarm secret, the nodes'")->required();
    relay_cmd->add_option("--out", relay_options.out, "where to write what it relayed (JSON)");
    relay_cmd->add_option("--relay-mbit", relay_mbit, "its [peer].relay_mbit")
        ->capture_default_str();
    relay_cmd->add_option("--wait-s", relay_options.wait_s, "how long it serves at most")
        ->capture_default_str();
    bool verbose = false;
    app.add_flag("--verbose", verbose, "the peer layer's debug log (pairing, anchors) on stderr");
    CLI11_PARSE(app, argc, argv);
    spdlog::set_level(verbose ? spdlog::level::debug : spdlog::level::warn);

    try {
        if (tcp_cmd->parsed()) return tcp(connect, tcp_seconds, tcp_reps, tcp_out);
        const ModelConfig shape = load_train_config(config_path).model;
        if (loopback_cmd->parsed()) return loopback(shape, reps, tcp_seconds, tcp_reps);
        if (signature_cmd->parsed()) return signature(shape, reps);
        if (relay_cmd->parsed()) return relay(relay_options, relay_mbit);
        return node(shape, node_options);
    } catch (const std::exception& e) {
        std::fflush(stdout);
        std::fprintf(stderr, "bench_exchange: %s\n", e.what());
        return 1;
    }
}
