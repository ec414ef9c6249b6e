// One swarm member's peer layer: a gRPC server for the Peer service, bootstrap from seeds and a
// cache of last-known peers, push-pull gossip of membership and SWIM failure detection (direct
// probe, indirect probe through k members, suspicion, death), a graceful leave, partner choice
// for a round (peer/pairing.h) and the exchange with that partner (peer/exchange.h). One thread
// runs the protocol, one tick every gossip interval; the gRPC server answers on its own threads.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/server.h>
#include <grpcpp/support/channel_arguments.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "peer/address.h"
#include "peer/auth.h"
#include "peer/exchange.h"
#include "peer/failure_tally.h"
#include "peer/connection_gate.h"
#include "peer/identity.h"
#include "peer/member_scores.h"
#include "peer/membership.h"
#include "peer/pairing.h"
#include "peer/round_messages.h"
#include "peer/state_sync.h"
#include "peer/tls.h"

namespace starling {

struct PeerConfig {
    std::string listen = "127.0.0.1:0";  // port 0: any free port (tests)
    std::string announce;                // what peers dial; empty: the listen host and bound port
    std::vector<std::string> seeds;      // host:port of members to join through
    // The addresses a seed names (peer/address.h), each tried until one is a member that is not
    // this node; replaceable so that a test can give a name several addresses without a DNS server.
    std::function<std::vector<std::string>(const std::string&)> resolve_seed = resolve_seed_targets;
    std::string swarm_id = "starling";
    std::string swarm_secret;  // the same on every node of a swarm; may be empty with TLS
    TlsConfig tls;             // mutual TLS on the peer port when set (peer/tls.h)
    std::string fingerprint;   // the model's; members with another are never paired
    std::string model;         // its signature (model_signature), named when they differ
    // How rounds combine ("noloco fused", "diloco", ...); members with another are never paired.
    std::string method;
    std::filesystem::path data_dir;  // node.key and peers.txt; empty: fresh identity, no cache
    std::chrono::milliseconds gossip_interval{1000};
    std::chrono::milliseconds probe_timeout{500};
    int indirect_probes = 3;
    MembershipLimits membership;
    std::chrono::milliseconds join_backoff_max{30000};
    size_t max_message_bytes =
        4u << 20;  // any one membership RPC; exchange frames have their own cap
    std::chrono::milliseconds pair_timeout{5000};  // T_pair: choosing a round's partner, in all
    // T_xchg: a whole exchange, end to end, at least; a partner whose measured rate (or, before an
    // exchange with it, min_link_bytes_per_s) needs longer for the message gets up to the ceiling.
    std::chrono::milliseconds exchange_timeout{10000};
    std::chrono::milliseconds exchange_timeout_max{600000};
    double min_link_bytes_per_s = 1.25e6;  // 10 Mbit/s
    // A state copy's chunk calls (FetchOptions): the least and the most time one gets, and the
    // rate assumed before a donor's first chunk, which makes it the slowest link supported.
    std::chrono::milliseconds state_sync_timeout{10000};
    std::chrono::milliseconds state_sync_timeout_max{120000};
    double state_sync_min_link_bytes_per_s = 125000;  // 1 Mbit/s
    uint64_t max_round_gap = 1;  // S_max: a partner's round differs by at most this
    int max_server_threads = 32;
    int max_concurrent_snapshot_chunks = 4;  // state sync chunks this node serves at once
    // Connections that have not yet carried an authenticated call (peer/connection_gate.h).
    ConnectionLimits connections;
    size_t snapshots_kept =
        2;  // so a joiner's fetch survives the next publish (and see SnapshotStore)
    RateLimit rate_limit;
};

// What a seed says to an authenticated Ping from a throwaway identity (`starling check`): its
// member digest when it accepted this config's swarm secret (or TLS credentials), else why not,
// in its words.
struct SeedAnswer {
    std::optional<Member> member;
    std::string problem;  // when member is empty
};
SeedAnswer ask_seed(const PeerConfig& config, const std::string& seed,
                    std::chrono::milliseconds timeout);

class PeerNode {
public:
    explicit PeerNode(const PeerConfig& config);
    PeerNode(PeerConfig config, NodeIdentity identity);
    ~PeerNode();  // stops like kill() if still running
    PeerNode(const PeerNode&) = delete;
    PeerNode& operator=(const PeerNode&) = delete;

    // Binds, joins through the seeds (and cached peers), starts the protocol thread. When no seed
    // answers the node starts alone and keeps retrying with backoff. Throws starling::Error when
    // it cannot listen, when its announce address cannot work, or when another live node already
    // holds its node id.
    void start();
    // Announces LEFT to every reachable member, then stops.
    void leave();
    // What the standard gRPC health service on the peer port reports (when it is enabled): a
    // draining node says NOT_SERVING, so load balancers and probes stop sending to it.
    void set_serving(bool serving);
    // Stops at once without a word: what peers see when a node crashes.
    void kill();

    uint64_t node_id() const { return identity_.node_id(); }
    const std::string& address() const { return address_; }
    std::vector<Member> members() const { return table_->all(); }
    std::vector<uint64_t> pairable_ids() const { return table_->pairable_ids(); }
    void set_round(uint64_t round) { table_->set_round(round); }
    // This node's mean inner step time, said in its digests; and what the pairable members said.
    void set_step_seconds(double seconds) { table_->set_step_seconds(seconds); }
    std::vector<double> pairable_step_seconds() const { return table_->pairable_step_seconds(); }
    // Pings each of these members at once and merges the digests they answer with: their round
    // as of now, where gossip takes some intervals to carry it. Returns within the probe timeout.
    void refresh(const std::vector<uint64_t>& node_ids);
    // Milliseconds the last answered direct probe of a member took; nullopt before one.
    std::optional<double> round_trip_ms(uint64_t node_id) const;
    // Connections this node keeps to other nodes (membership and exchange ones counted apart).
    size_t open_channels() const;
    // What went wrong in the peer layer since the start, by reason (peer/failure_tally.h):
    // others' calls this node refused for failed authentication, connections closed before they
    // authenticated, this node's joins a seed refused, exchanges, pairing calls and round-message
    // fetches cut off by their deadlines, partners' messages malformed or mismatched. The daemon
    // keeps its own tally of what its round loop meets (NodeState::failures).
    FailureCounts failures() const;
    // Called through the daemon's round link (daemon/swarm/peer_round_link.h) after each outer
    // step.
    // What the outer step of `round` made of `member`'s message: nullopt when it entered the
    // step, else why it was refused. Refusals in a row quarantine the member (MemberScores):
    // this node does not pair with it for a while, and says so at warn, naming it.
    void judged(uint64_t member, uint64_t round, const std::optional<std::string>& refusal);
    std::optional<MemberScore> score_of(uint64_t member) const { return scores_.score(member); }
    // The members this node does not pair with in its current round.
    std::vector<uint64_t> quarantined() const;
    // More addresses to join through (a reloaded config's); tried on the next tick.
    void add_seeds(const std::vector<std::string>& seeds);
    // More addresses to join through now (`starling join HOST:PORT`): each is dialled at once, all
    // of them together, each address within 4 probe timeouts and all before `by`. One that
    // answers is kept as a seed (tried again like the config's); one that does not is logged at
    // warn and not kept. Returns per seed, in order, "" when the node joined through it, else why
    // not.
    std::vector<std::string> join_seeds(const std::vector<std::string>& seeds,
                                        SteadyClock::time_point by);
    // Puts the TLS files at `tls`'s paths in use for connections made from now on, once they pass
    // check_tls_files (peer/tls.h); throws starling::Error naming the problem and keeps the old
    // ones otherwise, or when `tls` would turn TLS on or off, which takes a restart. Nothing to do
    // without TLS.
    void reload_tls(const TlsConfig& tls);

    // CHOOSE_PARTNERS for groups of two (peer/pairing.h): the partner for `round`, which becomes
    // this node's advertised round, or nullopt for a solo round. Returns within pair_timeout,
    // whatever the others do. One call per round at a time; none once the node has stopped.
    std::optional<Member> choose_partner(uint64_t round);
    // The exchange of slot.round with the partner chosen for it (peer/exchange.h), both messages
    // at once; returns by slot.deadline (the exchange budget), or within exchange_timeout without
    // one (plus the moment a cancelled stream takes to end). A round may exchange more than once
    // with its partner.
    ExchangeResult exchange(ExchangeSlot slot);
    // The time an exchange of `bytes` with `partner` gets (exchange_budget): from the rate of the
    // last whole exchange with it, or the config's minimum before one.
    std::chrono::milliseconds exchange_budget_with(uint64_t partner, uint64_t bytes) const;

    // DiLoCo's all-gather (peer/round_messages.h): this node publishes its round's message here...
    RoundMessageBoard& round_messages() { return round_messages_; }
    // ...and fetches the round's message of each of `members` at once, each into its decoder
    // (decoders[i] for members[i]), within exchange_timeout. Returns per member the error ("" when
    // the message arrived whole) and the tokens it said; adds the bytes read to *bytes.
    struct Gathered {
        std::string error;
        uint64_t tokens = 0;
    };
    std::vector<Gathered> gather(uint64_t round, std::span<const uint64_t> members,
                                 std::span<codec::MessageDecoder* const> decoders, uint64_t* bytes);

    // What this node serves to joiners (peer/state_sync.h): the daemon publishes its snapshots
    // here.
    SnapshotStore& snapshots() { return snapshots_; }
    // A joiner's catch-up: fetches the snapshot most live compatible members hold, from all of
    // them at once, into destination. Throws starling::Error when no member can deliver one.
    FetchResult fetch_state(const SnapshotExpectation& expected, std::span<std::byte> destination,
                            const FetchOptions& options = {});

private:
    class Service;
    // Self: the seed's address is this node's own (a name that covers every member, say).
    enum class JoinResult { Joined, Unreachable, Duplicate, Self };
    // Exchanges get connections of their own, so bulk chunks never queue ahead of probes.
    enum class ChannelUse { Membership, Exchange };

    grpc::ChannelArguments channel_arguments(ChannelUse use) const;
    std::shared_ptr<grpc::Channel> channel(const std::string& address,
                                           ChannelUse use = ChannelUse::Membership);
    // Each address of the seed gets 4 probe timeouts, or what is left before `by` when less.
    JoinResult try_join(const std::string& seed, std::string* why,
                        SteadyClock::time_point by = SteadyClock::time_point::max());
    JoinResult join_through(const std::string& seed, const std::shared_ptr<grpc::Channel>& channel,
                            std::string* why, SteadyClock::time_point by);
    // A channel of its own to one of the addresses of a seed with several, verified (with TLS)
    // against the seed's host name, since the certificate names that and not the address.
    std::shared_ptr<grpc::Channel> seed_address_channel(const std::string& target,
                                                        const std::string& seed);
    std::optional<Member> ping(const std::string& address, uint64_t target_id);
    bool probe(const Member& target);
    void gossip_with(const Member& target);
    std::optional<std::string> duplicate_of(const Member& joiner);
    void run();
    void tick();
    void maintain_seeds(SteadyClock::time_point now);
    void save_peer_cache();
    // Forgets connections to addresses that are neither members nor seeds any more (and the
    // round-trip times of former members), so a long-lived node in a swarm with churn does not
    // keep one for every peer it ever met.
    void close_unused_channels();
    void stop(bool announce);
    // Our proposal to `to` for a round: the round's partner afterwards, if any, and whether `to`
    // declined for now only (not choosing for the round yet, or busy), so asking again may work.
    struct Proposal {
        std::optional<uint64_t> partner;
        bool ask_again = false;
    };
    Proposal propose(uint64_t round, uint64_t to, PairMode mode, uint64_t digest, uint64_t nonce,
                     SteadyClock::time_point deadline);
    grpc::Status answer_pair(uint64_t caller, const v1::PairRequest& request,
                             v1::PairResponse* response);
    // Whether this node holds `caller` as its partner for `round` (waiting briefly when its own
    // proposal to the caller is still being answered).
    bool paired_with(uint64_t round, uint64_t caller);
    // Asks the partner whether it holds this node as its partner for the round too; false, with
    // why, when it does not or cannot be asked.
    bool confirm_pairing(uint64_t round, const Member& partner, SteadyClock::time_point deadline,
                         std::string* why);
    grpc::Status answer_exchange(grpc::ServerContext& context, ExchangeServerStream& stream,
                                 uint64_t caller);
    // A pairing call its deadline cut off counts as a timeout when it was allowed a probe's time at
    // least: one that began as the round's pairing budget ran out met the budget's end, not a
    // peer too slow to answer.
    void count_if_cut_off(const grpc::Status& status, SteadyClock::duration allowed);

    PeerConfig config_;
    NodeIdentity identity_;
    SwarmAuth auth_;
    std::unique_ptr<TlsCertificates> tls_;  // configured files (reload_tls) or the secret's
    std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;
    SnapshotStore snapshots_;
    RoundMessageBoard round_messages_;
    std::unique_ptr<StateSyncService> state_sync_;
    std::string address_;
    std::unique_ptr<MemberTable> table_;
    std::unique_ptr<PairingBook> pairing_;
    std::unique_ptr<ExchangeBoard> exchanges_;
    std::unique_ptr<Service> service_;
    uint64_t tls_failures_before_ = 0;      // the process's failed TLS handshakes when it started
    std::unique_ptr<ConnectionGate> gate_;  // the peer port's accept loop, in front of server_
    std::unique_ptr<grpc::Server> server_;

    mutable Mutex rtt_mutex_;
    std::map<uint64_t, double> rtt_ms_ ABSL_GUARDED_BY(rtt_mutex_);
    // By partner, from the last whole exchange.
    std::map<uint64_t, double> exchange_bytes_per_s_ ABSL_GUARDED_BY(rtt_mutex_);

    mutable Mutex channels_mutex_;
    std::map<std::pair<std::string, ChannelUse>, std::shared_ptr<grpc::Channel>> channels_
        ABSL_GUARDED_BY(channels_mutex_);

    struct SeedState {
        std::chrono::milliseconds backoff{0};
        SteadyClock::time_point next_try{};
    };
    Mutex seeds_mutex_;
    std::map<std::string, SeedState> seeds_ ABSL_GUARDED_BY(seeds_mutex_);

    std::mt19937_64 rng_;  // the protocol thread's
    std::vector<uint64_t> probe_order_;
    size_t probe_next_ = 0;
    std::vector<std::string> cached_addresses_;

    Mutex run_mutex_;
    std::condition_variable wake_;
    bool stopping_ ABSL_GUARDED_BY(run_mutex_) = false;
    std::atomic<bool> running_{false};
    FailureTally failures_;  // all but the refusals auth_ counts itself
    MemberScores scores_;
    std::thread thread_;
};

}  // namespace starling
