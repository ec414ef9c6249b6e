#include "peer/state_sync.h"

#include <sodium.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <fmt/format.h>
#include <mutex>
#include <numeric>

#include "common/error.h"
#include "peer/wire.h"

namespace starling {
namespace {

template <typename T>
void append_le(std::string& out, T value) {
    for (size_t i = 0; i < sizeof(T); ++i)
        out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

}  // namespace

Hash256 blake2b_256(std::span<const std::byte> bytes) {
    Hash256 hash{};
    crypto_generichash(hash.data(), hash.size(),
                       reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), nullptr,
                       0);
    return hash;
}

std::string short_snapshot_id(const Hash256& id) {
    return fmt::format("{:02x}{:02x}{:02x}{:02x}", id[0], id[1], id[2], id[3]);
}

uint64_t SnapshotManifestInfo::chunk_size(uint32_t index) const {
    const uint64_t start = uint64_t{index} * chunk_bytes;
    return std::min<uint64_t>(chunk_bytes, total_bytes - start);
}

Hash256 SnapshotManifestInfo::computed_id() const {
    std::string canonical = "starling snapshot v1";
    append_le<uint32_t>(canonical, static_cast<uint32_t>(fingerprint.size()));
    canonical += fingerprint;
    append_le<uint64_t>(canonical, round);
    append_le<uint64_t>(canonical, total_bytes);
    append_le<uint32_t>(canonical, chunk_bytes);
    append_le<uint32_t>(canonical, chunk_count());
    for (const Hash256& h : chunk_hashes)
        canonical.append(reinterpret_cast<const char*>(h.data()), h.size());
    append_le<uint32_t>(canonical, static_cast<uint32_t>(metadata.size()));
    canonical += metadata;
    return blake2b_256(as_bytes(canonical));
}

Snapshot::Snapshot(std::string fingerprint, uint64_t round, std::string metadata,
                   std::vector<std::byte> bytes, uint32_t chunk_bytes)
    : Snapshot(std::move(fingerprint), round, std::move(metadata),
               std::make_shared<const std::vector<std::byte>>(std::move(bytes)), chunk_bytes) {}

Snapshot::Snapshot(std::string fingerprint, uint64_t round, std::string metadata,
                   std::shared_ptr<const std::vector<std::byte>> bytes, uint32_t chunk_bytes)
    : bytes_(std::move(bytes)) {
    ensure_sodium();
    if (chunk_bytes == 0 || chunk_bytes > kMaxSnapshotChunkBytes)
        throw Error(fmt::format("snapshot chunk size {} is outside 1..{}", chunk_bytes,
                                kMaxSnapshotChunkBytes));
    if (metadata.size() > kMaxSnapshotMetadataBytes)
        throw Error(fmt::format("snapshot metadata of {} bytes exceeds {}", metadata.size(),
                                kMaxSnapshotMetadataBytes));
    manifest_.fingerprint = std::move(fingerprint);
    manifest_.round = round;
    manifest_.total_bytes = bytes_->size();
    manifest_.chunk_bytes = chunk_bytes;
    manifest_.metadata = std::move(metadata);
}

const SnapshotManifestInfo& Snapshot::manifest() const {
    std::call_once(hashed_, [this] {
        const uint32_t chunk_bytes = manifest_.chunk_bytes;
        const std::span<const std::byte> all = bytes();
        for (uint64_t start = 0; start < all.size(); start += chunk_bytes)
            manifest_.chunk_hashes.push_back(blake2b_256(
                all.subspan(start, std::min<uint64_t>(chunk_bytes, all.size() - start))));
        manifest_.id = manifest_.computed_id();
    });
    return manifest_;
}

std::span<const std::byte> Snapshot::chunk(uint32_t index) const {
    return bytes().subspan(uint64_t{index} * manifest_.chunk_bytes, manifest_.chunk_size(index));
}

void SnapshotStore::publish(std::shared_ptr<const Snapshot> snapshot) {
    MutexLock lock(mutex_);
    snapshots_.push_back({std::move(snapshot)});
    if (snapshots_.size() <= keep_) return;
    // Past the newest `keep`: up to max_leased of those being read or leased stay, those being
    // read first, then those whose lease runs longest.
    const auto now = Clock::now();
    auto rank = [&](size_t i) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
        return std::make_pair(snapshots_[i].readers > 0, snapshots_[i].leased_until);
    };
    std::vector<size_t> older(snapshots_.size() - keep_);
    std::iota(older.begin(), older.end(), size_t{0});
    std::stable_sort(older.begin(), older.end(),
                     [&](size_t a, size_t b)
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return rank(a) > rank(b); });
    std::vector<bool> stays(older.size(), false);
    for (size_t i = 0; i < std::min(max_leased_, older.size()); i++) {
        const Held& held = snapshots_[older[i]];
        stays[older[i]] = held.readers > 0 || held.leased_until > now;
    }
    for (size_t i = older.size(); i-- > 0;)
        if (!stays[i]) snapshots_.erase(snapshots_.begin() + static_cast<std::ptrdiff_t>(i));
}

std::shared_ptr<const Snapshot> SnapshotStore::latest() const {
    MutexLock lock(mutex_);
    return snapshots_.empty() ? nullptr : snapshots_.back().snapshot;
}

size_t SnapshotStore::index_locked(std::span<const unsigned char> id) const {
    for (size_t i = 0; i < snapshots_.size(); i++) {
        const Hash256& own = snapshots_[i].snapshot->manifest().id;
        if (std::equal(id.begin(), id.end(), own.begin(), own.end())) return i;
    }
    return snapshots_.size();
}

std::shared_ptr<const Snapshot> SnapshotStore::find(std::span<const unsigned char> id) const {
    MutexLock lock(mutex_);
    const size_t i = index_locked(id);
    return i < snapshots_.size() ? snapshots_[i].snapshot : nullptr;
}

std::shared_ptr<const Snapshot> SnapshotStore::lease_latest() {
    MutexLock lock(mutex_);
    if (snapshots_.empty()) return nullptr;
    Held& held = snapshots_.back();
    held.leased_until = std::max(held.leased_until, Clock::now() + lease_);
    return held.snapshot;
}

std::shared_ptr<const Snapshot> SnapshotStore::begin_read(std::span<const unsigned char> id) {
    MutexLock lock(mutex_);
    const size_t i = index_locked(id);
    if (i == snapshots_.size()) return nullptr;
    snapshots_[i].readers++;
    return snapshots_[i].snapshot;
}

void SnapshotStore::end_read(const Snapshot* snapshot) {
    MutexLock lock(mutex_);
    for (Held& held : snapshots_)
        if (held.snapshot.get() == snapshot) {
            held.readers--;
            held.leased_until = std::max(held.leased_until, Clock::now() + lease_);
        }
}

size_t SnapshotStore::size() const {
    MutexLock lock(mutex_);
    return snapshots_.size();
}

void to_proto(const SnapshotManifestInfo& manifest, v1::SnapshotManifest* out) {
    out->set_snapshot_id(manifest.id.data(), manifest.id.size());
    out->set_fingerprint(manifest.fingerprint);
    out->set_round(manifest.round);
    out->set_total_bytes(manifest.total_bytes);
    out->set_chunk_bytes(manifest.chunk_bytes);
    for (const Hash256& h : manifest.chunk_hashes) out->add_chunk_hashes(h.data(), h.size());
    out->set_metadata(manifest.metadata);
}

StateSyncService::StateSyncService(SnapshotStore& store, SwarmAuth& auth, int max_concurrent_chunks)
    : store_(store), auth_(auth), max_concurrent_chunks_(max_concurrent_chunks) {}

grpc::Status StateSyncService::GetManifest(grpc::ServerContext* context,
                                           const v1::GetManifestRequest*,
                                           v1::SnapshotManifest* response) {
    uint64_t caller = 0;
    if (auto status = auth_.verify(*context, "GetManifest", &caller); !status.ok()) return status;
    const auto snapshot = store_.lease_latest();
    if (!snapshot) return {grpc::StatusCode::UNAVAILABLE, "this node has no snapshot to offer yet"};
    to_proto(snapshot->manifest(), response);
    return grpc::Status::OK;
}

grpc::ServerUnaryReactor* StateSyncService::FetchChunk(grpc::CallbackServerContext* context,
                                                       const v1::FetchChunkRequest* request,
                                                       v1::SnapshotChunk* response) {
    // Ends the snapshot's read once the answer has left or the call failed.
    class Reading final : public grpc::ServerUnaryReactor {
    public:
        Reading(SnapshotStore& store, std::shared_ptr<const Snapshot> snapshot)
            : store_(store), snapshot_(std::move(snapshot)) {}
        void OnDone() override {
            if (snapshot_) store_.end_read(snapshot_.get());
            delete this;
        }

    private:
        SnapshotStore& store_;
        std::shared_ptr<const Snapshot> snapshot_;
    };
    uint64_t caller = 0;
    grpc::Status status = auth_.verify(*context, "FetchChunk", &caller);
    std::shared_ptr<const Snapshot> snapshot;
    if (status.ok()) {
        snapshot = store_.begin_read(
            {reinterpret_cast<const unsigned char*>(request->snapshot_id().data()),
             request->snapshot_id().size()});
        status = snapshot ? serve_chunk(*request, *snapshot, response)
                          : grpc::Status(grpc::StatusCode::NOT_FOUND,
                                         "snapshot no longer held; ask for the manifest again");
    }
    auto* reading = new Reading(store_, std::move(snapshot));
    reading->Finish(status);
    return reading;
}

grpc::Status StateSyncService::serve_chunk(const v1::FetchChunkRequest& request,
                                           const Snapshot& snapshot, v1::SnapshotChunk* response) {
    if (request.index() >= snapshot.manifest().chunk_count())
        return {grpc::StatusCode::OUT_OF_RANGE,
                fmt::format("chunk {} of a snapshot with {}", request.index(),
                            snapshot.manifest().chunk_count())};
    if (serving_.fetch_add(1) >= max_concurrent_chunks_) {
        serving_.fetch_sub(1);
        return {
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            fmt::format("already serving {} chunks; try again shortly", max_concurrent_chunks_)};
    }
    auto bytes = snapshot.chunk(request.index());
    if (request.max_bytes() > 0)
        bytes = bytes.first(std::min<size_t>(bytes.size(), request.max_bytes()));
    response->set_index(request.index());
    response->set_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    serving_.fetch_sub(1);
    return grpc::Status::OK;
}

}  // namespace starling
