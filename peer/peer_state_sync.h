// A node's side of state sync (peer/state_sync.h) in both directions: the snapshots it serves to
// joiners and the StateSync service that serves them, and its own catch-up, which copies the
// snapshot most live compatible members hold from all of them at once.
#pragma once

#include <grpcpp/security/credentials.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>

#include "peer/auth.h"
#include "peer/membership.h"
#include "peer/state_sync.h"

namespace starling {

class PeerStateSync {
public:
    // snapshots_kept: so a joiner's fetch survives the next publish (see SnapshotStore);
    // call_timeout: within which a joiner's next call follows the last.
    PeerStateSync(SwarmAuth& auth, size_t snapshots_kept, std::chrono::milliseconds call_timeout,
                  int max_concurrent_chunks);

    // The daemon publishes its snapshots here.
    SnapshotStore& snapshots() { return snapshots_; }
    grpc::Service& service() { return service_; }
    // Fetches the snapshot most of `table`'s live compatible members hold, from all of them at
    // once, into destination. Throws starling::Error when no member can deliver one.
    FetchResult fetch(const MemberTable& table,
                      const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                      const SnapshotExpectation& expected, std::span<std::byte> destination,
                      const FetchOptions& options);

private:
    SwarmAuth& auth_;
    SnapshotStore snapshots_;
    StateSyncService service_;
};

}  // namespace starling
