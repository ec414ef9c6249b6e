// A node's reachability, kept current: it asks up to three live members that do not say they are
// private (this node could not call them) to dial back its
// announced address (peer/dial_back.h), judges their answers (peer/reachability.h), says the
// verdict in its own digest, so members learn it by gossip, and logs a change (a Private one at
// warn, with what to do). It asks as soon as it knows a member, again every few seconds while the
// verdict is Unknown, and every few minutes once there is one, so a port forwarded later is seen.
// It also answers members' dial-back requests, a few at a time and one per caller per interval.
#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "common/mutex.h"
#include "peer/auth.h"
#include "peer/dial_back.h"
#include "peer/membership.h"
#include "peer/peer_channels.h"
#include "peer/reachability.h"
#include "starling/v1/peer.pb.h"

namespace starling {

// How long a helper's dial may take, and how long after it this node waits for the nonce.
inline constexpr std::chrono::milliseconds kDialBackTimeout{3000};
inline constexpr std::chrono::milliseconds kDialBackArrival{1000};
inline constexpr std::chrono::seconds kRecheckUndecided{10};
inline constexpr std::chrono::minutes kRecheckDecided{5};
// What a helper allows: one request per caller per interval, this many dials at once.
inline constexpr std::chrono::seconds kDialBackPerCaller{2};
inline constexpr int kConcurrentDialBacks = 4;

// Asks the member behind `channel` to dial `address` back with a fresh nonce and waits for the
// nonce at `inbox`; `context` (deadline not yet set) lets the caller cancel the call.
DialBackResult ask_dial_back(const std::shared_ptr<grpc::Channel>& channel, const SwarmAuth& auth,
                             const std::string& address, DialBackInbox& inbox,
                             grpc::ClientContext& context);

// What an operator can do about an address no member could dial, from the hosts the members saw
// this node's calls come from and whether something else answers there.
std::string reachability_advice(const std::string& announced, const ReachabilityVerdict& verdict);

class ReachabilityWatch {
public:
    ReachabilityWatch(MemberTable& table, PeerChannels& channels, const SwarmAuth& auth);
    ~ReachabilityWatch();  // stop()
    ReachabilityWatch(const ReachabilityWatch&) = delete;
    ReachabilityWatch& operator=(const ReachabilityWatch&) = delete;

    // Where the peer port's gate delivers dial-backs.
    DialBackInbox& inbox() { return inbox_; }
    // Starts checking the table's own address on a thread of its own.
    void start();
    // Ends the checks and the dial-backs in flight within about 100 ms.
    void stop();
    ReachabilityVerdict verdict() const;

    // The helper's side: dials `request.address` and says how it went, and where the call came
    // from (`peer`, gRPC's form of the caller's address).
    grpc::Status answer_dial_back(uint64_t caller, const std::string& peer,
                                  const v1::DialBackRequest& request,
                                  v1::DialBackResponse* response);

private:
    void run();
    // One check: asks members, judges, records; returns whether there was anyone to ask.
    bool check();

    MemberTable& table_;
    PeerChannels& channels_;
    const SwarmAuth& auth_;
    DialBackInbox inbox_;
    std::mt19937_64 rng_{std::random_device{}()};

    mutable Mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
    ReachabilityVerdict verdict_ ABSL_GUARDED_BY(mutex_);
    std::map<uint64_t, std::chrono::steady_clock::time_point> asked_ ABSL_GUARDED_BY(mutex_);
    std::set<grpc::ClientContext*> asking_ ABSL_GUARDED_BY(mutex_);  // calls of the check in flight
    std::atomic<bool> cancelled_{false};
    std::atomic<int> dialing_{0};
    std::thread thread_;
};

}  // namespace starling
