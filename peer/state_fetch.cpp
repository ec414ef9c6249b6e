// The joiner's side of state sync: manifests from every donor, the offers judged and raced, and a
// fetch of one snapshot's chunks from all of its holders at once, each chunk checked against its
// hash, the whole judged again before it is returned.
#include "peer/state_sync.h"

#include <grpcpp/create_channel.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <future>
#include <set>
#include <thread>
#include <tuple>

#include "common/error.h"
#include "common/mutex.h"

namespace starling {

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
            MutexLock lock(mutex_);
            while (
                !lock.wait_for(disarmed_changed_, std::chrono::milliseconds(100),
                               [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) { return disarmed_; })) {
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
            MutexLock lock(mutex_);
            disarmed_ = true;
        }
        disarmed_changed_.notify_all();
        if (thread_.joinable()) thread_.join();
    }
    CancelIfGone(const CancelIfGone&) = delete;
    CancelIfGone& operator=(const CancelIfGone&) = delete;

    // Whether the call was cancelled for that; read once the call has returned.
    bool cancelled() {
        MutexLock lock(mutex_);
        return cancelled_;
    }

private:
    Mutex mutex_;
    std::condition_variable disarmed_changed_;
    bool disarmed_ ABSL_GUARDED_BY(mutex_) = false;
    bool cancelled_ ABSL_GUARDED_BY(mutex_) = false;
    std::thread thread_;
};

constexpr const char* kDonorGone =
    "the donor is gone (the failure detector declared it dead, or it left)";

// One fetch of one snapshot from the donors that hold it: a shared queue of chunk indices that
// per-donor workers drain. A donor that fails gives its chunk back and stops.
class ChunkFetch {
public:
    ChunkFetch(const SnapshotManifestInfo& manifest, std::vector<char>& done,
               std::span<std::byte> destination, SwarmAuth& auth, const FetchOptions& options)
        : manifest_(manifest),
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
        // The workers are joined, so nothing contends for the lock; it is taken so that the
        // analysis sees the guarded members read under it.
        MutexLock lock(mutex_);
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
                MutexLock lock(mutex_);
                lock.wait(wake_, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
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
            MutexLock lock(mutex_);
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
                if (slow) {
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
                    spdlog::warn("state sync: dropping {}", last_error_);
                }
            }
            wake_.notify_all();
            // A busy donor's back-off is this worker's alone: the others go on meanwhile.
            lock.unlock();
            if (busy) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
    }

    // Four times the time this donor's measured rate (or, before a chunk has come, the slowest
    // supported link's, shared by the calls in flight) needs for the chunk, within the bounds.
    std::chrono::milliseconds chunk_timeout(const std::string& address, uint32_t index) {
        MutexLock lock(mutex_);
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
        if (blake2b_256(std::as_bytes(std::span(data))) != manifest_.chunk_hashes[index]) {
            *error = fmt::format("chunk {} does not match its hash in the manifest", index);
            return false;
        }
        std::memcpy(destination_.data() + uint64_t{index} * manifest_.chunk_bytes, data.data(),
                    data.size());
        return true;
    }

    const SnapshotManifestInfo& manifest_;
    std::vector<char>& done_ ABSL_GUARDED_BY(mutex_);
    std::span<std::byte> destination_;
    SwarmAuth& auth_;
    const FetchOptions& options_;
    Mutex mutex_;
    std::condition_variable wake_;
    std::deque<uint32_t> pending_ ABSL_GUARDED_BY(mutex_);
    int inflight_ ABSL_GUARDED_BY(mutex_) = 0;
    uint32_t finished_ ABSL_GUARDED_BY(mutex_) = 0;
    std::set<std::string> stopped_
        ABSL_GUARDED_BY(mutex_);  // no more chunks from these in this fetch
    std::set<std::string> dropped_ ABSL_GUARDED_BY(mutex_);  // nor in any later one
    std::map<std::string, uint32_t> delivered_ ABSL_GUARDED_BY(mutex_);
    struct DonorPace {
        double bytes_per_s = 0;  // of one call, from the donor's last chunk; 0 before one
        int timeouts = 0;        // in a row
        std::chrono::milliseconds at_least{0};  // after a timeout: twice the deadline that ran out
    };
    std::map<std::string, DonorPace> pace_ ABSL_GUARDED_BY(mutex_);
    std::string last_error_ ABSL_GUARDED_BY(mutex_);
};

// In a NoLoCo swarm every node's snapshot is its own, so the best offers have one holder each, and
// a holder may sit behind a link of any speed: among the newest kRacedOffers with the most
// holders (and donors refused before only when there are none else), the first to deliver a probe
// of kRaceProbeBytes (or its whole first chunk, if smaller) is the one fetched. Losers' calls are
// cancelled at once. None when there is nothing to race (one such offer) or no racer delivered.
constexpr size_t kRacedOffers = 3;
const SnapshotOffer* race_offers(
    const std::vector<const SnapshotOffer*>& ranked,
    const std::map<std::string, std::shared_ptr<grpc::Channel>>& channels, SwarmAuth& auth,
    const FetchOptions& options, const std::function<bool(const SnapshotOffer&)>& refused_before) {
    const SnapshotOffer& first = *ranked.front();
    std::vector<const SnapshotOffer*> racers;
    for (const SnapshotOffer* offer : ranked)
        if (offer->donors.size() == first.donors.size() &&
            refused_before(*offer) == refused_before(first) && racers.size() < kRacedOffers)
            racers.push_back(offer);
    if (racers.size() < 2 || first.donors.size() > 1) return nullptr;
    std::atomic<const SnapshotOffer*> winner{nullptr};
    FetchOptions race = options;
    race.donor_gone = [&](const std::string& donor) {
        return winner.load() != nullptr || (options.donor_gone && options.donor_gone(donor));
    };
    std::vector<std::thread> threads;
    for (const SnapshotOffer* offer : racers) {
        threads.emplace_back([&, offer] {
            const std::string& donor = offer->donors.front();
            v1::FetchChunkRequest request;
            request.set_snapshot_id(offer->manifest.id.data(), offer->manifest.id.size());
            request.set_index(0);
            request.set_max_bytes(kRaceProbeBytes);
            v1::SnapshotChunk probe;
            grpc::ClientContext context;
            context.set_deadline(std::chrono::system_clock::now() + options.call_timeout);
            auth.attach(context, "FetchChunk");
            CancelIfGone watch(context, race, donor);
            const grpc::Status status =
                v1::StateSync::NewStub(channels.at(donor))->FetchChunk(&context, request, &probe);
            const SnapshotOffer* none = nullptr;
            if (status.ok() && !probe.data().empty()) winner.compare_exchange_strong(none, offer);
        });
    }
    for (auto& t : threads) t.join();
    if (const SnapshotOffer* won = winner.load())
        spdlog::info("state sync: {} offers of one donor each raced with a {} KiB probe; {} won",
                     racers.size(), kRaceProbeBytes >> 10, won->donors.front());
    return winner.load();
}

// A judge refused the offer: logged naming its donors and why; they serve nothing more in this
// fetch.
void refuse(const SnapshotOffer& offer, const std::string& why,
            std::map<std::string, std::shared_ptr<grpc::Channel>>& channels,
            std::string& last_error) {
    last_error = fmt::format("snapshot {} of round {} from {} refused: {}",
                             short_snapshot_id(offer.manifest.id), offer.manifest.round,
                             fmt::join(offer.donors, ", "), why);
    spdlog::warn("state sync: {}", last_error);
    for (const std::string& donor : offer.donors) channels.erase(donor);
}

}  // namespace

FetchResult fetch_snapshot(const std::vector<std::string>& donors, SwarmAuth& auth,
                           const std::shared_ptr<grpc::ChannelCredentials>& credentials,
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
    const auto refused_before = [&](const SnapshotOffer& offer) {
        return std::all_of(offer.donors.begin(), offer.donors.end(), [&](const std::string& d) {
            return options.refused_before.contains(d);
        });
    };
    FetchResult result;
    std::vector<char> done;
    std::string last_error = "no donor offered a snapshot";
    // A refused snapshot is not a failed attempt: its donors are gone, so refusals end with them.
    for (int failed = 0; failed < options.attempts && !channels.empty();) {
        // Every donor's manifest at once; group the donors by the snapshot they offer. Those
        // still silent past the grace after the first offer are let go (manifest_grace).
        const auto asked_at = std::chrono::steady_clock::now();
        std::atomic<int64_t> first_offer_ns{-1};  // after asked_at
        const auto past_grace = [&] {
            const int64_t first = first_offer_ns.load();
            return first >= 0 && std::chrono::steady_clock::now() - asked_at >
                                     3 * std::chrono::nanoseconds(first) + options.manifest_grace;
        };
        FetchOptions manifest_phase = options;
        manifest_phase.donor_gone = [&](const std::string& donor) {
            return past_grace() || (options.donor_gone && options.donor_gone(donor));
        };
        std::map<std::string, std::future<std::pair<grpc::Status, v1::SnapshotManifest>>> asked;
        for (const auto& [address, channel] : channels) {
            asked[address] =
                std::async(std::launch::async, [&, address = address, channel = channel] {
                    v1::SnapshotManifest manifest;
                    grpc::ClientContext context;
                    context.set_deadline(std::chrono::system_clock::now() + options.call_timeout);
                    auth.attach(context, "GetManifest");
                    CancelIfGone watch(context, manifest_phase, address);
                    auto status =
                        v1::StateSync::NewStub(channel)->GetManifest(&context, {}, &manifest);
                    if (watch.cancelled()) {
                        const bool gone = options.donor_gone && options.donor_gone(address);
                        const auto seconds = [](auto d) {
                            return std::chrono::duration<double>(d).count();
                        };
                        status = grpc::Status(
                            grpc::StatusCode::CANCELLED,
                            gone ? kDonorGone
                                 : fmt::format(
                                       "no manifest within {:.1f} s, where another donor "
                                       "offered one in {:.1f} s",
                                       seconds(std::chrono::steady_clock::now() - asked_at),
                                       seconds(std::chrono::nanoseconds(first_offer_ns.load()))));
                    } else if (status.ok()) {
                        int64_t none = -1;
                        first_offer_ns.compare_exchange_strong(
                            none, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                      std::chrono::steady_clock::now() - asked_at)
                                      .count());
                    }
                    return std::make_pair(status, manifest);
                });
        }
        std::map<Hash256, SnapshotOffer> offers;
        for (auto& [address, answer] : asked) {
            auto [status, manifest] = answer.get();
            try {
                if (!status.ok()) throw Error(status.error_message());
                SnapshotManifestInfo info = check_manifest(manifest, expected);
                offers[info.id].manifest = info;
                offers[info.id].donors.push_back(address);
            } catch (const Error& e) {
                last_error = fmt::format("donor {}: {}", address, e.what());
                spdlog::warn("state sync: {}", last_error);
                channels.erase(address);
            }
        }
        if (options.refuse_offer) {
            std::vector<SnapshotOffer> offered;
            for (const auto& [id, offer] : offers) offered.push_back(offer);
            for (const SnapshotOffer& offer : offered) {
                if (const auto why = options.refuse_offer(offer, offered)) {
                    refuse(offer, *why, channels, last_error);
                    offers.erase(offer.manifest.id);
                }
            }
        }
        if (offers.empty()) break;
        // Donors refused before last; then the snapshot most donors hold, the newest among equals:
        // the most bandwidth to fetch from.
        const auto rank = [&](const SnapshotOffer* offer) {
            return std::make_tuple(!refused_before(*offer), offer->donors.size(),
                                   offer->manifest.round);
        };
        std::vector<const SnapshotOffer*> ranked;
        for (const auto& [id, offer] : offers) ranked.push_back(&offer);
        std::sort(
            ranked.begin(), ranked.end(),
            [&](const SnapshotOffer* a, const SnapshotOffer* b) { return rank(a) > rank(b); });
        const SnapshotOffer* raced = race_offers(ranked, channels, auth, options, refused_before);
        const SnapshotOffer& best = raced ? *raced : *ranked.front();
        const SnapshotManifestInfo& manifest = best.manifest;
        // Chunks already fetched for an earlier snapshot stay where their hash is unchanged.
        std::vector<char> keep(manifest.chunk_count(), 0);
        if (!done.empty() && result.manifest.chunk_bytes == manifest.chunk_bytes)
            for (uint32_t i = 0; i < manifest.chunk_count(); ++i)
                keep[i] = done[i] && result.manifest.chunk_hashes[i] == manifest.chunk_hashes[i];
        done = std::move(keep);
        result.manifest = manifest;
        std::map<std::string, std::shared_ptr<grpc::Channel>> holders;
        for (const auto& address : best.donors) holders[address] = channels[address];
        spdlog::info("state sync: snapshot {} of round {} ({} bytes, {} chunks) from {} donor(s)",
                     short_snapshot_id(manifest.id), manifest.round, manifest.total_bytes,
                     manifest.chunk_count(), holders.size());
        ChunkFetch fetch(manifest, done, destination, auth, options);
        for (const auto& address : fetch.run(holders, result.chunks_per_donor, last_error))
            channels.erase(address);
        if (!std::all_of(done.begin(), done.end(), [](char d) { return d != 0; })) {
            ++failed;
            continue;
        }
        if (options.refuse_snapshot) {
            if (const auto why = options.refuse_snapshot(best, destination)) {
                refuse(best, *why, channels, last_error);
                done.clear();  // the refused state's chunks are no start for another snapshot
                continue;
            }
        }
        return result;
    }
    throw Error(
        "state sync: no donor could deliver a verified snapshot this node accepts (last problem: " +
        last_error + ")");
}

}  // namespace starling
