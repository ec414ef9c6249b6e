// A node's part in each round, over the members its MembershipProtocol knows: choosing a partner
// (both sides agree before either waits), the pairwise exchange with it and the rate each
// partner's link gave, DiLoCo's round messages (published here, fetched from every member), the
// judgement of each member's messages and the quarantine of those refused too often, and the
// server's side of each of those calls. It is the one writer of the round this node advertises
// in its digests.
#pragma once

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>
#include <grpcpp/support/sync_stream.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "codec/message.h"
#include "common/mutex.h"
#include "peer/anchor_hub.h"
#include "peer/auth.h"
#include "peer/exchange.h"
#include "peer/exchange_relay.h"
#include "peer/failure_tally.h"
#include "peer/hole_punch.h"
#include "peer/identity.h"
#include "peer/member_scores.h"
#include "peer/membership.h"
#include "peer/pairing.h"
#include "peer/peer_channels.h"
#include "peer/peer_config.h"
#include "peer/round_deposits.h"
#include "peer/round_messages.h"
#include "starling/v1/peer.pb.h"

namespace starling {

class RoundPeers {
public:
    // identity signs this node's messages and must outlive it; anchors: the streams private
    // members hold to this node, down which this node's own proposals to them go;
    // adopt_punched: hands a punched connection to the peer port's gRPC server
    // (ConnectionGate::adopt), for a partner that opens its exchange over it.
    RoundPeers(const PeerConfig& config, const NodeIdentity& identity, MemberTable& table,
               SwarmAuth& auth, PeerChannels& channels, FailureTally& failures, AnchorHub& anchors,
               std::function<void(UniqueFd)> adopt_punched = {});

    // This node is at `round` from now on, in the digests it gives (a state copy adopted, rounds
    // skipped, a local round ended). Choosing a partner and publishing a round message say so
    // themselves.
    void advertise(uint64_t round);

    // CHOOSE_PARTNERS for groups of two (peer/pairing.h): the partner for `round`, which becomes
    // this node's advertised round, or nullopt for a solo round. Returns within pair_timeout,
    // whatever the others do. One call per round at a time; none once stopped.
    std::optional<Member> choose_partner(uint64_t round);
    // The exchange of slot.round with the partner chosen for it (peer/exchange.h), both messages
    // at once; returns by slot.deadline (the exchange budget), or within exchange_timeout without
    // one (plus the moment a cancelled stream takes to end). A round may exchange more than once
    // with its partner.
    ExchangeResult exchange(ExchangeSlot slot);
    // The time an exchange of `bytes` with `partner` gets (exchange_budget): from the rate of the
    // last whole exchange with it, or the config's minimum before one.
    std::chrono::milliseconds exchange_budget_with(uint64_t partner, uint64_t bytes) const;

    // DiLoCo's all-gather (peer/round_messages.h): this node's message of `round`, which becomes
    // its advertised round, and which a private node deposits with its anchors
    // (peer/round_deposits.h)...
    void publish(uint64_t round, RoundMessage message);
    // ...and the round's message of each of `members`, fetched at once, each into its decoder
    // (decoders[i] for members[i]), within exchange_timeout: from the member, or from the anchors
    // of a private one. Returns per member the error ("" when the message arrived whole) and the
    // tokens it said; adds the bytes read to *bytes.
    struct Gathered {
        std::string error;
        uint64_t tokens = 0;
    };
    std::vector<Gathered> gather(uint64_t round, std::span<const uint64_t> members,
                                 std::span<codec::MessageDecoder* const> decoders, uint64_t* bytes);

    // What the outer step of `round` made of `member`'s message: nullopt when it entered the
    // step, else why it was refused. Repeated refusals quarantine the member (MemberScores):
    // this node does not pair with it for a while, and says so at warn, naming it.
    void judged(uint64_t member, uint64_t round, const std::optional<std::string>& refusal);
    std::optional<MemberScore> score_of(uint64_t member) const { return scores_.score(member); }
    // The members this node does not pair with in its current round.
    std::vector<uint64_t> quarantined() const;
    // Forgets the link rates of partners that are no longer members.
    void forget_departed(const std::set<uint64_t>& members);
    // Bytes of private members' round messages this node took in and served as their anchor, and
    // those it holds now (peer/round_deposits.h).
    uint64_t relayed_bytes() const { return deposits_.bytes_relayed(); }
    // Exchanges between private members this node relayed (peer/exchange_relay.h), and their
    // bytes; this node's own exchanges that went through a relay.
    uint64_t relayed_exchanges() const { return relay_.exchanges_relayed(); }
    uint64_t relayed_exchange_bytes() const { return relay_.bytes_relayed(); }
    uint64_t exchanges_through_relay() const { return exchanges_through_relay_; }
    // Hole punches to a private partner (peer/hole_punch.h) that connected, and that did not (the
    // exchange then went through the relay); exchanges that ran over a punched connection.
    uint64_t hole_punches() const { return hole_punches_; }
    uint64_t failed_hole_punches() const { return failed_hole_punches_; }
    uint64_t punched_exchanges() const { return punched_exchanges_; }
    uint64_t deposited_bytes() const { return deposits_.bytes_held(); }
    // Pairing waits, exchanges, deposits and round-message waits end at once; later calls fail.
    void stop();
    ~RoundPeers();

    // The server's side of the round's calls, for a caller whose proof was checked.
    grpc::Status answer_pair(uint64_t caller, const v1::PairRequest& request,
                             v1::PairResponse* response);
    grpc::Status answer_exchange(grpc::ServerContext& context, ExchangeServerStream& stream,
                                 uint64_t caller);
    grpc::Status answer_round_message(uint64_t caller, const v1::FetchRoundMessageRequest& request,
                                      grpc::ServerWriter<v1::RoundMessageFrame>& writer);
    grpc::Status answer_deposit(uint64_t caller,
                                grpc::ServerReader<v1::DepositRoundMessageFrame>& reader);
    // One side of two private members' exchange, relayed by this node (RelayExchange): only
    // between members neither of which can be dialed, one of which this node anchors.
    grpc::Status answer_relay_exchange(grpc::ServerContext& context, ExchangeServerStream& stream,
                                       uint64_t caller);

    // A proposal to a private member through its anchors (RelayPair, peer/anchors.h), in turn
    // while time is left, until one carries it to the member and back. From a private node the
    // proposal names the anchor it goes through as the exchange's relay, and *via, when given, is
    // then that anchor (0 when no relay was named).
    grpc::Status relay_pair(const Member& target, const v1::PairRequest& request,
                            SteadyClock::duration allowed, v1::PairResponse* response,
                            uint64_t* via = nullptr);
    // The relay agreed with `partner` for `round`, when the two cannot dial each other.
    std::optional<uint64_t> relay_for(uint64_t round, uint64_t partner) const;

private:
    // Our proposal to `to` for a round: the round's partner afterwards, if any, and whether `to`
    // declined for now only (not choosing for the round yet, or busy), so asking again may work.
    struct Proposal {
        std::optional<uint64_t> partner;
        bool ask_again = false;
    };
    Proposal propose(uint64_t round, uint64_t to, PairMode mode, uint64_t digest, uint64_t nonce,
                     SteadyClock::time_point deadline);
    // Whether this node holds `caller` as its partner for `round` (waiting briefly when its own
    // proposal to the caller is still being answered).
    bool paired_with(uint64_t round, uint64_t caller);
    // Asks the partner whether it holds this node as its partner for the round too; false, with
    // why, when it does not or cannot be asked.
    bool confirm_pairing(uint64_t round, const Member& partner, SteadyClock::time_point deadline,
                         std::string* why);
    // A pairing call its deadline cut off counts as a timeout when it was allowed a probe's time at
    // least: one that began as the round's pairing budget ran out met the budget's end, not a
    // peer too slow to answer.
    void count_if_cut_off(const grpc::Status& status, SteadyClock::duration allowed);
    // A proposal to a member at its address.
    grpc::Status call_pair(const std::string& address, const v1::PairRequest& request,
                           SteadyClock::duration allowed, v1::PairResponse* response);
    // This side's exchange stream on `channel` (to the partner, or with RelayExchange to the
    // relay, naming the partner), authenticated and ended at once when the node stops.
    ExchangeResult open_tracked_exchange(const std::shared_ptr<grpc::Channel>& channel,
                                         ExchangeSlot& slot, SteadyClock::time_point deadline,
                                         ExchangeMethod method = ExchangeMethod::Exchange);
    // The exchange of `slot` through the relay agreed for it, this side's stream to the relay.
    ExchangeResult exchange_through_relay(ExchangeSlot& slot, uint64_t relay,
                                          SteadyClock::time_point deadline);
    // `partner_endpoint`: where the partner's punch port is seen, "" when it gave none; with
    // one, the punch to it starts now (start_punch).
    void agree_relay(uint64_t round, uint64_t partner, uint64_t relay,
                     const std::string& partner_endpoint);
    // A punch from this node's port to the partner's at `endpoint`, on a thread of its own, for
    // at most punch_timeout; invalid where this node has no endpoint to give. It starts at the
    // agreement, which both sides reach within a round trip of each other, where their exchanges
    // may start seconds apart (one side still training): each side punches only for a while.
    std::future<UniqueFd> start_punch(uint64_t partner, const std::string& endpoint);
    // relay_for, waiting until `until` for the agreement to be recorded.
    std::optional<uint64_t> await_relay(uint64_t round, uint64_t partner,
                                        SteadyClock::time_point until);
    // The punch started for the exchange with `partner` in `round`, taken (invalid: none).
    std::future<UniqueFd> take_punch(uint64_t round, uint64_t partner);
    // The exchange of `slot` over the connection `punch` gives to the private partner: nullopt
    // when none connected or nothing went over it, and the relay is to carry it.
    std::optional<ExchangeResult> exchange_punched(ExchangeSlot& slot, const Member& partner,
                                                   std::future<UniqueFd> punch,
                                                   SteadyClock::time_point deadline);
    // A private node's punch port as one of its anchors sees it, asked again once a minute; what
    // its proposals and answers through a relay give (punch_endpoint_for), "" before it knows.
    void refresh_punch_endpoint();
    // What this node gives `partner` as its punch endpoint: "" while a punch to it failed in
    // the last few minutes (PunchFailures), so that neither side tries.
    std::string punch_endpoint_for(uint64_t partner);
    // A private node's message of `round` to each of its anchors, each on a thread of its own
    // (the last round's are joined first).
    void deposit(uint64_t round, const RoundMessage& message, const std::vector<uint64_t>& anchors);
    // Where to fetch `member`'s round message on the attempt-th try: its own address, or one of
    // its anchors' when it is private, in turn from one that depends on this node's id; "" when a
    // private member names no anchor known.
    std::string round_message_source(const Member& member, size_t attempt) const;

    const PeerConfig& config_;
    const NodeIdentity& identity_;
    const uint64_t node_id_;
    MemberTable& table_;
    SwarmAuth& auth_;
    PeerChannels& channels_;
    FailureTally& failures_;
    AnchorHub& anchors_;
    PairingBook pairing_;
    // When the last choice of a partner began (choose_partner: one at a time); the members heard
    // from since then are asked first (random_candidates).
    SteadyClock::time_point last_choice_ = SteadyClock::time_point::min();
    ExchangeBoard exchanges_;
    RoundMessageBoard messages_;
    RoundDeposits deposits_;
    Mutex deposits_mutex_;
    std::vector<std::thread> deposit_threads_ ABSL_GUARDED_BY(deposits_mutex_);
    MemberScores scores_;
    ExchangeRelay relay_;
    std::atomic<uint64_t> exchanges_through_relay_{0};
    struct AgreedRelay {
        uint64_t relay = 0;
        bool punching = false;        // a punch was begun for it
        std::future<UniqueFd> punch;  // start_punch's, until the exchange takes it
    };
    Mutex agreeing_mutex_;  // agree_relay: one at a time; taken before relays_mutex_
    mutable Mutex relays_mutex_;
    // By round and partner, the relay agreed with it, for the last few rounds.
    std::map<std::pair<uint64_t, uint64_t>, AgreedRelay> relays_ ABSL_GUARDED_BY(relays_mutex_);
    std::condition_variable relay_recorded_;  // with relays_mutex_: agree_relay recorded one
    // Punches an exchange stopped waiting for, kept until they end (a future of std::async waits
    // for its thread when destroyed).
    std::vector<std::future<UniqueFd>> unfinished_punches_ ABSL_GUARDED_BY(relays_mutex_);
    std::function<void(UniqueFd)> adopt_punched_;
    mutable Mutex punch_mutex_;
    // Made once this node learns it is private, when hole punching is on.
    std::shared_ptr<PunchPort> punch_port_ ABSL_GUARDED_BY(punch_mutex_);
    std::string punch_endpoint_ ABSL_GUARDED_BY(punch_mutex_);
    std::optional<SteadyClock::time_point> punch_observed_ ABSL_GUARDED_BY(punch_mutex_);
    PunchFailures punch_failures_ ABSL_GUARDED_BY(punch_mutex_);
    std::atomic<uint64_t> hole_punches_{0}, failed_hole_punches_{0}, punched_exchanges_{0};
    std::atomic<bool> stopping_{false};
    std::atomic<bool> running_{true};
    mutable Mutex rates_mutex_;
    // By partner, from the last whole exchange.
    std::map<uint64_t, double> exchange_bytes_per_s_ ABSL_GUARDED_BY(rates_mutex_);
};

}  // namespace starling
