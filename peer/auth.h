// Proof of swarm membership on every peer RPC. The caller puts in the call's metadata its node
// id, public key and the time, an HMAC-SHA256 of those and the method under a key derived from
// the swarm secret (proves it belongs to the swarm) and an Ed25519 signature of the same (proves
// it owns the node id). The callee checks all of it before touching the request; a call that
// fails gets UNAUTHENTICATED and has no effect. Integrity of the request body and protection
// against replay inside the clock window come from TLS where it is configured.
#pragma once

#include <grpcpp/client_context.h>
#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/mutex.h"
#include "common/throttle.h"
#include "common/token_bucket.h"
#include "peer/identity.h"

namespace starling {

struct RateLimit {
    double per_second = 200;  // sustained requests per caller
    double burst = 400;
    size_t max_callers = 4096;  // callers tracked at once; the stalest is forgotten beyond it
};

// A 32-byte key for one use (named by `domain`) derived from the swarm secret; throws
// starling::Error when the secret is empty.
std::array<unsigned char, 32> swarm_derived_key(std::string_view domain,
                                                std::string_view swarm_secret);

class SwarmAuth {
public:
    // Throws starling::Error when the secret is empty.
    SwarmAuth(std::string_view swarm_secret, const NodeIdentity& identity, RateLimit limit = {},
              std::chrono::seconds clock_window = std::chrono::seconds(60));

    void attach(grpc::ClientContext& context, std::string_view method) const;

    // OK with *caller set to the proven node id; UNAUTHENTICATED naming what failed; or
    // RESOURCE_EXHAUSTED when this caller exceeds its request rate.
    // Every UNAUTHENTICATED answer is counted; a wrong swarm secret is also logged at warn (at
    // most every 30 s): a node with another secret would otherwise train alone, unnoticed.
    grpc::Status verify(const grpc::ServerContextBase& context, std::string_view method,
                        uint64_t* caller);
    // Called for every call whose credentials prove it, before the rate limit; set before the
    // server takes calls.
    void on_proven(std::function<void(const grpc::ServerContextBase& call)> hook) {
        on_proven_ = std::move(hook);
    }
    // Calls refused as UNAUTHENTICATED since the start, whatever failed.
    uint64_t refusals() const { return refusals_.load(); }

private:
    std::string canonical(std::string_view method, std::string_view node, std::string_view key,
                          std::string_view time) const;
    bool admit(uint64_t caller);
    void warn_wrong_secret(const grpc::ServerContextBase& context, std::string_view node);

    std::array<unsigned char, 32> swarm_key_{};
    const NodeIdentity& identity_;
    RateLimit limit_;
    std::chrono::seconds clock_window_;
    std::function<void(const grpc::ServerContextBase&)> on_proven_;

    Mutex mutex_;
    std::unordered_map<uint64_t, TokenBucket> buckets_ ABSL_GUARDED_BY(mutex_);
    std::atomic<uint64_t> refusals_{0};
    std::atomic<uint64_t> wrong_secret_refusals_{0};  // for the warning's count
    Throttle wrong_secret_warning_ ABSL_GUARDED_BY(mutex_){std::chrono::seconds(30)};
};

}  // namespace starling
