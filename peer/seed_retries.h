// When a node dials each of its seeds again, without I/O: a seed that is neither this node nor a
// reachable member is due at once when added, then after each failed try with a backoff doubling
// from the gossip interval to join_backoff_max; one that was joined but is still no member by its
// address (a name that covers many members, a service's) only every join_backoff_max. The caller
// dials: MembershipProtocol over gRPC, the simulator over its network. So two parts of a swarm
// that declared each other dead in a partition find each other again through their seeds.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "peer/membership.h"

namespace starling {

class SeedRetries {
public:
    SeedRetries(std::chrono::milliseconds first_backoff, std::chrono::milliseconds max_backoff);

    void add(const std::string& seed);  // a new seed, or one whose backoff starts over: due now
    // The seeds to dial at `now`: those whose time has come and of which `is_member` (asked only
    // for those) says no. A member's backoff starts over.
    std::vector<std::string> due(SteadyClock::time_point now,
                                 const std::function<bool(const std::string&)>& is_member);
    void tried(const std::string& seed, bool joined, SteadyClock::time_point now);
    std::vector<std::string> seeds() const;

private:
    struct Backoff {
        std::chrono::milliseconds wait{0};
        SteadyClock::time_point next_try{};
    };

    const std::chrono::milliseconds first_, max_;
    mutable Mutex mutex_;
    std::map<std::string, Backoff> seeds_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace starling
