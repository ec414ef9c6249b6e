// State sync: how a joiner catches up (the donor's side in state_sync.cpp, the joiner's in
// state_fetch.cpp). A live node publishes immutable snapshots of its training state (phi, outer
// momentum, AdamW state and counters, as bytes the daemon lays out) into a SnapshotStore, and
// serves them chunk by chunk through the StateSync service. A joiner asks every candidate donor
// for its manifest, picks the snapshot most donors hold, and fetches its chunks from all of them
// at once, a few in flight per donor, checking every chunk against the manifest's hash. When the
// best offers have one holder each (NoLoCo: every node's state is its own), the newest few race
// with a small probe of their first chunk and the first donor to deliver is the one fetched from,
// so a joiner does not copy from a member behind a slow link when others are near. A donor that
// dies or lies is dropped and its chunks go to the others; when no holder of that snapshot is
// left, the joiner starts over from another snapshot and keeps every chunk whose hash is
// unchanged. What the bytes mean is the daemon's: its judges (FetchOptions) may refuse an offer
// from the manifests or from the fetched bytes, and the joiner goes on with the next one.
#pragma once

#include <grpcpp/security/credentials.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "peer/auth.h"
#include "starling/v1/state.grpc.pb.h"

namespace starling {

inline constexpr uint32_t kDefaultSnapshotChunkBytes = 1u << 20;
// Below every RPC size cap (4 MiB) with room for framing.
inline constexpr uint32_t kMaxSnapshotChunkBytes = 2u << 20;
inline constexpr size_t kMaxSnapshotMetadataBytes = 64u << 10;
// What a race between offers asks of each racer (FetchChunkRequest.max_bytes): a quarter of a
// default chunk, since racers share the joiner's own link, yet well past what a link lets through
// at once before its rate shows (a token bucket's burst, socket buffers: tens of KiB).
inline constexpr uint32_t kRaceProbeBytes = 256u << 10;

using Hash256 = std::array<unsigned char, 32>;

// BLAKE2b-256: chunk hashes and snapshot ids.
Hash256 blake2b_256(std::span<const std::byte> bytes);
// The first 4 bytes in hex: how logs name a snapshot.
std::string short_snapshot_id(const Hash256& id);

// A checked manifest.
struct SnapshotManifestInfo {
    Hash256 id{};
    std::string fingerprint;
    uint64_t round = 0;
    uint64_t total_bytes = 0;
    uint32_t chunk_bytes = 0;
    std::vector<Hash256> chunk_hashes;
    std::string metadata;

    uint32_t chunk_count() const { return static_cast<uint32_t>(chunk_hashes.size()); }
    uint64_t chunk_size(uint32_t index) const;  // the last chunk may be short
    // BLAKE2b-256 of the canonical encoding of every field but id.
    Hash256 computed_id() const;
};

class Snapshot {
public:
    // Throws starling::Error on a chunk size of 0 or above kMaxSnapshotChunkBytes, or metadata
    // above kMaxSnapshotMetadataBytes. The chunks are hashed on the first call of manifest(), not
    // here: a node publishes a snapshot every round (gigabytes for large models) and most are never
    // fetched.
    Snapshot(std::string fingerprint, uint64_t round, std::string metadata,
             std::vector<std::byte> bytes, uint32_t chunk_bytes = kDefaultSnapshotChunkBytes);
    // The bytes shared with their owner, who may refill them for a later snapshot once it holds
    // the only reference (use_count() == 1), saving a fresh allocation of gigabytes each round.
    Snapshot(std::string fingerprint, uint64_t round, std::string metadata,
             std::shared_ptr<const std::vector<std::byte>> bytes,
             uint32_t chunk_bytes = kDefaultSnapshotChunkBytes);
    const SnapshotManifestInfo& manifest() const;  // thread-safe
    uint64_t round() const { return manifest_.round; }
    std::span<const std::byte> chunk(uint32_t index) const;
    std::span<const std::byte> bytes() const { return *bytes_; }

private:
    mutable std::once_flag hashed_;
    mutable SnapshotManifestInfo manifest_;
    std::shared_ptr<const std::vector<std::byte>> bytes_;
};

// The donor's side: the latest `keep` snapshots, so a fetch that began on one survives the next
// publish. Past those, a snapshot that a copy is reading stays: a copy over a slow link takes many
// rounds, and losing its snapshot midway would start it over. A chunk call reads its snapshot from
// the request until its answer has left (over a slow link that is most of the call), and leases
// it for `lease` after, the time for the joiner's next request; a manifest call leases the latest
// for `lease`, the time for the joiner's first chunk call. A copy that has finished holds its
// snapshot no longer than that, so finished copies do not crowd out one under way. At most
// `max_leased` older snapshots are held (each is a full copy of the state): those being read
// first, then those whose lease runs longest.
class SnapshotStore {
public:
    using Clock = std::chrono::steady_clock;
    explicit SnapshotStore(size_t keep = 2, Clock::duration lease = std::chrono::seconds(10),
                           size_t max_leased = 1)
        : keep_(keep), lease_(lease), max_leased_(max_leased) {}
    void publish(std::shared_ptr<const Snapshot> snapshot);
    std::shared_ptr<const Snapshot> latest() const;
    std::shared_ptr<const Snapshot> find(std::span<const unsigned char> id) const;
    // latest() for a manifest call: leased for `lease` from now (a lease never shortens).
    std::shared_ptr<const Snapshot> lease_latest();
    // find() for a chunk call, which must call end_read() with what it got once its answer has
    // left or failed: the snapshot is read until then, and leased for `lease` after.
    std::shared_ptr<const Snapshot> begin_read(std::span<const unsigned char> id);
    void end_read(const Snapshot* snapshot);
    size_t size() const;

private:
    struct Held {
        std::shared_ptr<const Snapshot> snapshot;
        int readers = 0;
        Clock::time_point leased_until{};
    };
    // The index of the snapshot with this id, or size() when none is held.
    size_t index_locked(std::span<const unsigned char> id) const
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

    size_t keep_;
    Clock::duration lease_;
    size_t max_leased_;
    mutable Mutex mutex_;
    std::deque<Held> snapshots_ ABSL_GUARDED_BY(mutex_);  // newest last
};

// GetManifest answers on a sync handler; FetchChunk on a callback one, whose completion tells
// when a chunk's answer has left, which is how long the chunk's snapshot is being read.
class StateSyncService final
    : public v1::StateSync::WithCallbackMethod_FetchChunk<v1::StateSync::Service> {
public:
    // max_concurrent_chunks: chunks served at once; more get RESOURCE_EXHAUSTED so one joiner
    // (or many) cannot starve the donor's training.
    StateSyncService(SnapshotStore& store, SwarmAuth& auth, int max_concurrent_chunks = 4);

    grpc::Status GetManifest(grpc::ServerContext* context, const v1::GetManifestRequest* request,
                             v1::SnapshotManifest* response) override;
    grpc::ServerUnaryReactor* FetchChunk(grpc::CallbackServerContext* context,
                                         const v1::FetchChunkRequest* request,
                                         v1::SnapshotChunk* response) override;

private:
    grpc::Status serve_chunk(const v1::FetchChunkRequest& request, const Snapshot& snapshot,
                             v1::SnapshotChunk* response);

    SnapshotStore& store_;
    SwarmAuth& auth_;
    int max_concurrent_chunks_;
    std::atomic<int> serving_{0};
};

void to_proto(const SnapshotManifestInfo& manifest, v1::SnapshotManifest* out);

struct SnapshotExpectation {
    std::string fingerprint;   // this node's model
    uint64_t total_bytes = 0;  // what this node's model implies: never what a donor says
};
// The manifest, or throws starling::Error naming what is wrong with it.
SnapshotManifestInfo check_manifest(const v1::SnapshotManifest& manifest,
                                    const SnapshotExpectation& expected);

// A snapshot on offer and the donors holding it.
struct SnapshotOffer {
    SnapshotManifestInfo manifest;
    std::vector<std::string> donors;
};

// Why an offer is refused, or empty to take it.
using OfferJudge = std::function<std::optional<std::string>(const SnapshotOffer& offer,
                                                            std::span<const SnapshotOffer> offers)>;
using SnapshotJudge = std::function<std::optional<std::string>(const SnapshotOffer& offer,
                                                               std::span<const std::byte> bytes)>;

struct FetchOptions {
    // A manifest call's deadline, and the least a chunk call gets. A chunk call's deadline follows
    // the rate measured from that donor's chunks (four times the expected transfer time), and,
    // before the first one, the slowest link supported: min_rate shared by the donor's calls in
    // flight. 1 MiB chunks, 2 in flight and 1 Mbit/s: 25 s, which makes 1 Mbit/s the slowest link
    // the defaults support.
    std::chrono::milliseconds call_timeout{10000};
    // Once one donor has offered its manifest, how much longer than three times that answer's
    // time the others have: a donor that answers nothing (its port drops connections, as a
    // private member's does before anyone knows it is private, or it froze) would otherwise hold
    // every copy up for the whole call timeout. One that answers later is left out of this try.
    std::chrono::milliseconds manifest_grace{2000};
    std::chrono::milliseconds max_call_timeout{120000};
    double min_rate_bytes_per_s = 125000;  // 1 Mbit/s
    // A donor whose chunk calls run out of time this many times in a row is dropped; before that
    // the chunk goes back to the queue and the donor's next deadline is at least twice the last.
    int timeouts_per_donor = 3;
    int inflight_per_donor = 2;
    int attempts = 3;  // manifests asked for again after the holders of a snapshot are gone
    // Asked every 100 ms while a call to a donor is in flight: true (the failure detector has
    // declared it dead or it left) cancels the call at once and drops the donor, where a frozen
    // donor would otherwise hold its chunks until the deadline. Empty: deadlines only.
    std::function<bool(const std::string& donor)> donor_gone;
    // Called after every verified chunk, from the fetching threads.
    std::function<void(uint32_t done, uint32_t total)> progress;
    // Matching hashes prove the bytes are the donor's, not that its state is any good; what the
    // bytes mean is the daemon's to judge. refuse_offer sees each offer beside every offer made
    // (manifests only, so an offer refused there costs no transfer), refuse_snapshot an offer's
    // whole verified bytes before the fetch returns them. A refused offer is logged at warn
    // naming its donors and why, its donors are dropped from this fetch, and the fetch goes on
    // with the next offer. Empty: every offer taken.
    OfferJudge refuse_offer;
    SnapshotJudge refuse_snapshot;
    // Donors refused by an earlier fetch: their offers come after every other one.
    std::set<std::string> refused_before;
};

struct FetchResult {
    SnapshotManifestInfo manifest;
    std::map<std::string, uint32_t> chunks_per_donor;  // verified chunks each donor delivered
};

// Fetches a snapshot into destination (expected.total_bytes long) from the donors at the given
// addresses. Throws starling::Error naming the problem when no donor can deliver a verified one
// that the judges in options accept.
FetchResult fetch_snapshot(const std::vector<std::string>& donors, SwarmAuth& auth,
                           const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                           const SnapshotExpectation& expected, std::span<std::byte> destination,
                           const FetchOptions& options = {});

}  // namespace starling
