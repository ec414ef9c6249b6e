#include "peer/state_sync.h"

#include <grpcpp/create_channel.h>
#include <sodium.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <fmt/format.h>
#include <future>
#include <numeric>
#include <set>
#include <thread>

#include "common/error.h"
#include "peer/identity.h"

namespace starling {
namespace {

Hash256 blake2b(std::span<const std::byte> bytes) {
    Hash256 hash{};
    crypto_generichash(hash.data(), hash.size(),
                       reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), nullptr,
                       0);
    return hash;
}

template <typename T>
void append_le(std::string& out, T value) {
    for (size_t i = 0; i < sizeof(T); ++i)
        out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

std::span<const std::byte> as_bytes(std::string_view text) {
    return std::as_bytes(std::span(text.data(), text.size()));
}

std::string hex_prefix(const Hash256& id) {
    return fmt::format("{:02x}{:02x}{:02x}{:02x}", id[0], id[1], id[2], id[3]);
}

}  // namespace

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
    return blake2b(as_bytes(canonical));
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
            manifest_.chunk_hashes.push_back(
                blake2b(all.subspan(start, std::min<uint64_t>(chunk_bytes, all.size() - start))));
        manifest_.id = manifest_.computed_id();
    });
    return manifest_;
}

std::span<const std::byte> Snapshot::chunk(uint32_t index) const {
    return bytes().subspan(uint64_t{index} * manifest_.chunk_bytes, manifest_.chunk_size(index));
}

void SnapshotStore::publish(std::shared_ptr<const Snapshot> snapshot) {
    std::lock_guard lock(mutex_);
    snapshots_.push_back({std::move(snapshot), {}});
    if (snapshots_.size() <= keep_) return;
    // Past the newest `keep`: the max_leased unexpired ones whose leases run longest stay.
    const auto now = Clock::now();
    std::vector<size_t> older(snapshots_.size() - keep_);
    std::iota(older.begin(), older.end(), size_t{0});
    std::stable_sort(older.begin(), older.end(), [&](size_t a, size_t b) {
        return snapshots_[a].leased_until > snapshots_[b].leased_until;
    });
    std::vector<bool> stays(older.size(), false);
    for (size_t rank = 0; rank < std::min(max_leased_, older.size()); rank++)
        if (snapshots_[older[rank]].leased_until > now) stays[older[rank]] = true;
    for (size_t i = older.size(); i-- > 0;)
        if (!stays[i]) snapshots_.erase(snapshots_.begin() + static_cast<std::ptrdiff_t>(i));
}

std::shared_ptr<const Snapshot> SnapshotStore::latest() const {
    std::lock_guard lock(mutex_);
    return snapshots_.empty() ? nullptr : snapshots_.back().snapshot;
}

const SnapshotStore::Held* SnapshotStore::find_locked(std::span<const unsigned char> id) const {
    for (const Held& held : snapshots_) {
        const Hash256& own = held.snapshot->manifest().id;
        if (std::equal(id.begin(), id.end(), own.begin(), own.end())) return &held;
    }
    return nullptr;
}

std::shared_ptr<const Snapshot> SnapshotStore::find(std::span<const unsigned char> id) const {
    std::lock_guard lock(mutex_);
    const Held* held = find_locked(id);
    return held ? held->snapshot : nullptr;
}

std::shared_ptr<const Snapshot> SnapshotStore::lease_latest() {
    std::lock_guard lock(mutex_);
    if (snapshots_.empty()) return nullptr;
    const Held& held = snapshots_.back();
    held.leased_until = std::max(held.leased_until, Clock::now() + manifest_lease_);
    return held.snapshot;
}

std::shared_ptr<const Snapshot> SnapshotStore::lease(std::span<const unsigned char> id) {
    std::lock_guard lock(mutex_);
    const Held* held = find_locked(id);
    if (!held) return nullptr;
    held->leased_until = std::max(held->leased_until, Clock::now() + lease_);
    return held->snapshot;
}

size_t SnapshotStore::size() const {
    std::lock_guard lock(mutex_);
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

grpc::Status StateSyncService::FetchChunk(grpc::ServerContext* context,
                                          const v1::FetchChunkRequest* request,
                                          v1::SnapshotChunk* response) {
    uint64_t caller = 0;
    if (auto status = auth_.verify(*context, "FetchChunk", &caller); !status.ok()) return status;
    const auto snapshot =
        store_.lease({reinterpret_cast<const unsigned char*>(request->snapshot_id().data()),
                      request->snapshot_id().size()});
    if (!snapshot)
        return {grpc::StatusCode::NOT_FOUND, "snapshot no longer held; ask for the manifest again"};
    if (request->index() >= snapshot->manifest().chunk_count())
        return {grpc::StatusCode::OUT_OF_RANGE,
                fmt::format("chunk {} of a snapshot with {}", request->index(),
                            snapshot->manifest().chunk_count())};
    if (serving_.fetch_add(1) >= max_concurrent_chunks_) {
        serving_.fetch_sub(1);
        return {
            grpc::StatusCode::RESOURCE_EXHAUSTED,
            fmt::format("already serving {} chunks; try again shortly", max_concurrent_chunks_)};
    }
    const auto bytes = snapshot->chunk(request->index());
    response->set_index(request->index());
    response->set_data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    serving_.fetch_sub(1);
    return grpc::Status::OK;
}

SnapshotManifestInfo check_manifest(const v1::SnapshotManifest& manifest,
                                    const SnapshotExpectation& expected) {
    SnapshotManifestInfo info;
    if (manifest.fingerprint() != expected.fingerprint)
        throw Error(fmt::format("snapshot of another model (fingerprint '{}', this node '{}')",
                                manifest.fingerprint(), expected.fingerprint));
    if (manifest.total_bytes() != expected.total_bytes)
        throw Error(fmt::format("snapshot of {} bytes, this node's state takes {}",
                                manifest.total_bytes(), expected.total_bytes));
    if (manifest.chunk_bytes() == 0 || manifest.chunk_bytes() > kMaxSnapshotChunkBytes)
        throw Error(fmt::format("snapshot chunk size {} outside 1..{}", manifest.chunk_bytes(),
                                kMaxSnapshotChunkBytes));
    const uint64_t count =
        (expected.total_bytes + manifest.chunk_bytes() - 1) / manifest.chunk_bytes();
    if (static_cast<uint64_t>(manifest.chunk_hashes_size()) != count)
        throw Error(fmt::format("snapshot lists {} chunk hashes for {} chunks",
                                manifest.chunk_hashes_size(), count));
    if (manifest.metadata().size() > kMaxSnapshotMetadataBytes)
        throw Error("snapshot metadata too large");
    if (manifest.snapshot_id().size() != info.id.size()) throw Error("snapshot id is not 32 bytes");
    info.fingerprint = manifest.fingerprint();
    info.round = manifest.round();
    info.total_bytes = manifest.total_bytes();
    info.chunk_bytes = manifest.chunk_bytes();
    info.metadata = manifest.metadata();
    for (const auto& h : manifest.chunk_hashes()) {
        if (h.size() != 32) throw Error("snapshot chunk hash is not 32 bytes");
        Hash256& hash = info.chunk_hashes.emplace_back();
        std::memcpy(hash.data(), h.data(), hash.size());
    }
    std::memcpy(info.id.data(), manifest.snapshot_id().data(), info.id.size());
    if (info.computed_id() != info.id)
        throw Error("snapshot manifest does not match its id (damaged or forged)");
    return info;
}

namespace {

// Cancels a client call once gone(donor) says so, asked every 100 ms until this is destroyed.
class CancelIfGone {
public:
    CancelIfGone(grpc::ClientContext& context, const FetchOptions& options,
                 const std::string& donor) {
        if (!options.donor_gone) return;
        thread_ = std::thread([this, &context, &options, donor] {
            std::unique_lock lock(mutex_);
            while (!disarmed_changed_.wait_for(lock, std::chrono::milliseconds(100),
                                               [&] { return disarmed_; })) {
                if (options.donor_gone(donor)) {
                    cancelled_ = true;
                    context.TryCancel();
                    return;
                }
            }
        });
    }
    ~CancelIfGone() {
        {
            std::lock_guard lock(mutex_);
            disarmed_ = true;
        }
        disarmed_changed_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    CancelIfGone(const CancelIfGone&) = delete;
    CancelIfGone& operator=(const CancelIfGone&) = delete;

    // Whether the call was cancelled for that; read once the call has returned.
    bool cancelled() {
        std::lock_guard lock(mutex_);
        return cancelled_;
    }

private:
    std::mutex mutex_;
    std::condition_variable disarmed_changed_;
    bool disarmed_ = false;
    bool cancelled_ = false;
    std::thread thread_;
};

constexpr const char* kDonorGone =
    "the donor is gone (the failure detector declared it dead, or it left)";

// One fetch of one snapshot from the donors that hold it: a shared queue of chunk indices that
// per-donor workers drain. A donor that fails gives its chunk back and stops. Quiet: no log lines,
// for a race whose losers are cancelled rather than failing.
class ChunkFetch {
public:
    ChunkFetch(const SnapshotManifestInfo& manifest, std::vector<char>& done,
               std::span<std::byte> destination, SwarmAuth& auth, const FetchOptions& options,
               bool quiet = false)
        : quiet_(quiet),
          manifest_(manifest),
          done_(done),
          destination_(destination),
          auth_(auth),
          options_(options) {
        for (uint32_t i = 0; i < manifest.chunk_count(); ++i)
            if (!done_[i]) pending_.push_back(i);
        finished_ = manifest.chunk_count() - static_cast<uint32_t>(pending_.size());
    }

    // Runs workers for every donor; returns the donors to drop (failed or lied).
    std::vector<std::string> run(
        const std::map<std::string, std::shared_ptr<grpc::Channel>>& donors,
        std::map<std::string, uint32_t>& delivered, std::string& last_error) {
        std::vector<std::thread> workers;
        for (const auto& [address, channel] : donors)
            for (int slot = 0; slot < options_.inflight_per_donor; ++slot)
                workers.emplace_back(
                    [&, address = address, channel = channel] { work(address, channel); });
        for (auto& w : workers) w.join();
        for (const auto& [address, count] : delivered_) delivered[address] += count;
        last_error = last_error_;
        return {dropped_.begin(), dropped_.end()};
    }

private:
    void work(const std::string& address, const std::shared_ptr<grpc::Channel>& channel) {
        const auto stub = v1::StateSync::NewStub(channel);
        for (;;) {
            uint32_t index = 0;
            {
                std::unique_lock lock(mutex_);
                wake_.wait(lock, [&] {
                    return !pending_.empty() || inflight_ == 0 || stopped_.contains(address);
                });
                if (pending_.empty() || stopped_.contains(address)) return;
                index = pending_.front();
                pending_.pop_front();
                ++inflight_;
            }
            std::string error;
            grpc::StatusCode code = grpc::StatusCode::OK;
            const auto timeout = chunk_timeout(address, index);
            const auto started = std::chrono::steady_clock::now();
            const bool ok = fetch_one(*stub, address, index, timeout, &error, &code);
            const double seconds =
                std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
            // Busy: wait and retry. Slow (out of time): retry with a longer deadline, dropped only
            // after a few in a row. Not found: an honest donor that moved on to a newer snapshot;
            // it stops serving this fetch but may offer the next one. Anything else: dropped.
            std::lock_guard lock(mutex_);
            DonorPace& pace = pace_[address];
            bool slow = false;
            if (code == grpc::StatusCode::DEADLINE_EXCEEDED) {
                // Calls in flight together share a deadline: one of them running out counts once.
                if (timeout >= pace.at_least) {
                    ++pace.timeouts;
                    pace.at_least = 2 * timeout;
                }
                slow = pace.timeouts < options_.timeouts_per_donor;
            }
            const bool busy = code == grpc::StatusCode::RESOURCE_EXHAUSTED || slow;
            const bool stale = code == grpc::StatusCode::NOT_FOUND;
            --inflight_;
            if (ok) {
                done_[index] = 1;
                ++delivered_[address];
                pace.timeouts = 0;
                pace.at_least = std::chrono::milliseconds(0);
                pace.bytes_per_s =
                    static_cast<double>(manifest_.chunk_size(index)) / std::max(seconds, 1e-3);
                if (options_.progress) options_.progress(++finished_, manifest_.chunk_count());
            } else {
                pending_.push_back(index);
                if (slow && !quiet_) {
                    spdlog::info(
                        "state sync: chunk {} from {} ran out of its {:.0f} s; asking again with more time",
                        index, address, std::chrono::duration<double>(timeout).count());
                }
                if (!busy) {
                    stopped_.insert(address);
                    last_error_ = fmt::format("donor {}: {}", address, error);
                }
                if (!busy && !stale) {
                    dropped_.insert(address);
                    if (!quiet_) spdlog::warn("state sync: dropping {}", last_error_);
                }
            }
            wake_.notify_all();
            if (busy) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }

    // Four times the time this donor's measured rate (or, before a chunk has come, the slowest
    // supported link's, shared by the calls in flight) needs for the chunk, within the bounds.
    std::chrono::milliseconds chunk_timeout(const std::string& address, uint32_t index) {
        std::lock_guard lock(mutex_);
        DonorPace& pace = pace_[address];
        if (pace.bytes_per_s <= 0)
            pace.bytes_per_s = options_.min_rate_bytes_per_s / options_.inflight_per_donor;
        const double seconds =
            4.0 * static_cast<double>(manifest_.chunk_size(index)) / pace.bytes_per_s;
        const auto wanted =
            std::chrono::milliseconds(static_cast<int64_t>(std::min(seconds, 1e7) * 1000));
        return std::clamp(std::max(wanted, pace.at_least), options_.call_timeout,
                          options_.max_call_timeout);
    }

    // On failure *code is the call's status, or INVALID_ARGUMENT for bad data.
    bool fetch_one(v1::StateSync::Stub& stub, const std::string& address, uint32_t index,
                   std::chrono::milliseconds timeout, std::string* error, grpc::StatusCode* code) {
        v1::FetchChunkRequest request;
        request.set_snapshot_id(manifest_.id.data(), manifest_.id.size());
        request.set_index(index);
        v1::SnapshotChunk response;
        grpc::ClientContext context;
        context.set_deadline(std::chrono::system_clock::now() + timeout);
        auth_.attach(context, "FetchChunk");
        CancelIfGone watch(context, options_, address);
        const auto status = stub.FetchChunk(&context, request, &response);
        if (!status.ok()) {
            *code = status.error_code();
            *error = watch.cancelled() ? kDonorGone : status.error_message();
            return false;
        }
        *code = grpc::StatusCode::INVALID_ARGUMENT;
        const auto& data = response.data();
        if (response.index() != index || data.size() != manifest_.chunk_size(index)) {
            *error = fmt::format("chunk {} came back as chunk {} of {} bytes", index,
                                 response.index(), data.size());
            return false;
        }
        if (blake2b(as_bytes(data)) != manifest_.chunk_hashes[index]) {
            *error = fmt::format("chunk {} does not match its hash in the manifest", index);
            return false;
        }
        std::memcpy(destination_.data() + uint64_t{index} * manifest_.chunk_bytes, data.data(),
                    data.size());
        return true;
    }

    bool quiet_;
    const SnapshotManifestInfo& manifest_;
    std::vector<char>& done_;
    std::span<std::byte> destination_;
    SwarmAuth& auth_;
    const FetchOptions& options_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::deque<uint32_t> pending_;
    int inflight_ = 0;
    uint32_t finished_ = 0;
    std::set<std::string> stopped_;  // no more chunks from these in this fetch
    std::set<std::string> dropped_;  // nor in any later one
    std::map<std::string, uint32_t> delivered_;
    struct DonorPace {
        double bytes_per_s = 0;  // of one call, from the donor's last chunk; 0 before one
        int timeouts = 0;        // in a row
        std::chrono::milliseconds at_least{0};  // after a timeout: twice the deadline that ran out
    };
    std::map<std::string, DonorPace> pace_;
    std::string last_error_;
};

// A snapshot on offer and the donors holding it.
using Offer = std::pair<SnapshotManifestInfo, std::vector<std::string>>;

struct RaceWinner {
    const Offer* offer = nullptr;
    std::vector<std::byte> chunk;  // its first chunk, verified
};

// In a NoLoCo swarm every node's snapshot is its own, so the best offers have one holder each, and
// a holder may sit behind a link of any speed: the first to deliver a verified first chunk, among
// the newest kRacedOffers with the most holders, is the one fetched. Losers' calls are cancelled
// at once. None when there is nothing to race (one such offer) or no racer delivered.
constexpr size_t kRacedOffers = 3;
std::optional<RaceWinner> race_first_chunk(
    const std::vector<const Offer*>& ranked,
    const std::map<std::string, std::shared_ptr<grpc::Channel>>& channels, SwarmAuth& auth,
    const FetchOptions& options) {
    std::vector<const Offer*> racers;
    for (const Offer* offer : ranked)
        if (offer->second.size() == ranked.front()->second.size() && racers.size() < kRacedOffers)
            racers.push_back(offer);
    if (racers.size() < 2 || ranked.front()->second.size() > 1) return std::nullopt;
    std::atomic<bool> decided{false};
    FetchOptions race = options;
    race.progress = nullptr;
    race.timeouts_per_donor = 1;
    race.donor_gone = [&](const std::string& donor) {
        return decided.load() || (options.donor_gone && options.donor_gone(donor));
    };
    std::mutex mutex;
    std::optional<RaceWinner> winner;
    std::vector<std::thread> threads;
    for (const Offer* offer : racers) {
        threads.emplace_back([&, offer] {
            const SnapshotManifestInfo& manifest = offer->first;
            // Every chunk but the first marked done: the fetch writes that one alone, at offset 0.
            std::vector<char> done(manifest.chunk_count(), 1);
            done[0] = 0;
            std::vector<std::byte> chunk(manifest.chunk_size(0));
            const std::string& donor = offer->second.front();
            ChunkFetch fetch(manifest, done, chunk, auth, race, /*quiet=*/true);
            std::map<std::string, uint32_t> delivered;
            std::string error;
            fetch.run({{donor, channels.at(donor)}}, delivered, error);
            std::lock_guard lock(mutex);
            if (done[0] && !winner) {
                winner = RaceWinner{offer, std::move(chunk)};
                decided = true;
            }
        });
    }
    for (auto& t : threads) t.join();
    if (winner)
        spdlog::info("state sync: {} offers of one donor each raced for their first chunk; {} won",
                     racers.size(), winner->offer->second.front());
    return winner;
}

}  // namespace

FetchResult fetch_snapshot(const std::vector<std::string>& donors, SwarmAuth& auth,
                           std::shared_ptr<grpc::ChannelCredentials> credentials,
                           const SnapshotExpectation& expected, std::span<std::byte> destination,
                           const FetchOptions& options) {
    ensure_sodium();
    if (destination.size() != expected.total_bytes)
        throw Error(fmt::format("state sync: destination of {} bytes for a state of {}",
                                destination.size(), expected.total_bytes));
    std::map<std::string, std::shared_ptr<grpc::Channel>> channels;
    for (const auto& address : donors) {
        grpc::ChannelArguments args;
        args.SetMaxReceiveMessageSize(
            static_cast<int>(kMaxSnapshotChunkBytes + kMaxSnapshotMetadataBytes + (64u << 10)));
        channels[address] = grpc::CreateCustomChannel(address, credentials, args);
    }
    FetchResult result;
    std::vector<char> done;
    std::string last_error = "no donor offered a snapshot";
    for (int attempt = 0; attempt < options.attempts && !channels.empty(); ++attempt) {
        // Every donor's manifest at once; group the donors by the snapshot they offer.
        std::map<std::string, std::future<std::pair<grpc::Status, v1::SnapshotManifest>>> asked;
        for (const auto& [address, channel] : channels) {
            asked[address] =
                std::async(std::launch::async, [&, address = address, channel = channel] {
                    v1::SnapshotManifest manifest;
                    grpc::ClientContext context;
                    context.set_deadline(std::chrono::system_clock::now() + options.call_timeout);
                    auth.attach(context, "GetManifest");
                    CancelIfGone watch(context, options, address);
                    auto status =
                        v1::StateSync::NewStub(channel)->GetManifest(&context, {}, &manifest);
                    if (watch.cancelled())
                        status = grpc::Status(grpc::StatusCode::CANCELLED, kDonorGone);
                    return std::make_pair(status, manifest);
                });
        }
        std::map<Hash256, Offer> offers;
        for (auto& [address, answer] : asked) {
            auto [status, manifest] = answer.get();
            try {
                if (!status.ok()) throw Error(status.error_message());
                SnapshotManifestInfo info = check_manifest(manifest, expected);
                offers[info.id].first = info;
                offers[info.id].second.push_back(address);
            } catch (const Error& e) {
                last_error = fmt::format("donor {}: {}", address, e.what());
                spdlog::warn("state sync: {}", last_error);
                channels.erase(address);
            }
        }
        if (offers.empty()) break;
        // The snapshot most donors hold, the newest among equals: the most bandwidth to fetch from.
        std::vector<const Offer*> ranked;
        for (const auto& [id, offer] : offers) ranked.push_back(&offer);
        std::sort(ranked.begin(), ranked.end(), [](const Offer* a, const Offer* b) {
            return std::make_pair(a->second.size(), a->first.round) >
                   std::make_pair(b->second.size(), b->first.round);
        });
        std::optional<RaceWinner> raced = race_first_chunk(ranked, channels, auth, options);
        const Offer& best = raced ? *raced->offer : *ranked.front();
        const SnapshotManifestInfo& manifest = best.first;
        // Chunks already fetched for an earlier snapshot stay where their hash is unchanged.
        std::vector<char> keep(manifest.chunk_count(), 0);
        if (!done.empty() && result.manifest.chunk_bytes == manifest.chunk_bytes)
            for (uint32_t i = 0; i < manifest.chunk_count(); ++i)
                keep[i] = done[i] && result.manifest.chunk_hashes[i] == manifest.chunk_hashes[i];
        done = std::move(keep);
        if (raced) {
            std::copy(raced->chunk.begin(), raced->chunk.end(), destination.begin());
            done[0] = 1;
            ++result.chunks_per_donor[best.second.front()];
        }
        result.manifest = manifest;
        std::map<std::string, std::shared_ptr<grpc::Channel>> holders;
        for (const auto& address : best.second) holders[address] = channels[address];
        spdlog::info("state sync: snapshot {} of round {} ({} bytes, {} chunks) from {} donor(s)",
                     hex_prefix(manifest.id), manifest.round, manifest.total_bytes,
                     manifest.chunk_count(), holders.size());
        ChunkFetch fetch(manifest, done, destination, auth, options);
        for (const auto& address : fetch.run(holders, result.chunks_per_donor, last_error))
            channels.erase(address);
        if (std::all_of(done.begin(), done.end(), [](char d) { return d != 0; })) return result;
    }
    throw Error("state sync: no donor could deliver a verified snapshot (last problem: " +
                last_error + ")");
}

}  // namespace starling
