// Snapshot donors are real StateSync gRPC servers on 127.0.0.1; the joiner fetches from them.
#include <grpcpp/create_channel.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <thread>
#include <future>
#include <random>

#include "common/error.h"
#include "peer/state_sync.h"

using namespace starling;
using namespace std::chrono_literals;

namespace {

const std::string kSecret = "state sync test secret";
const std::string kFingerprint = "00000000deadbeef";
constexpr uint32_t kChunk = 64u << 10;
constexpr uint64_t kTotal = 40 * kChunk + 1234;  // 41 chunks, the last one short

std::vector<std::byte> random_bytes(uint64_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::byte> bytes(n);
    for (auto& b : bytes) b = static_cast<std::byte>(rng());
    return bytes;
}

std::shared_ptr<const Snapshot> snapshot_of(const std::vector<std::byte>& bytes, uint64_t round) {
    return std::make_shared<Snapshot>(kFingerprint, round, "counters", bytes, kChunk);
}

// A donor: a real gRPC server with any StateSync service.
struct Donor {
    NodeIdentity identity = NodeIdentity::generate();
    SwarmAuth auth{kSecret, identity};
    SnapshotStore store;
    std::unique_ptr<grpc::Service> service;
    std::unique_ptr<grpc::Server> server;
    std::string address;

    explicit Donor(size_t keep = 2, std::unique_ptr<grpc::Service> custom = nullptr,
                   SnapshotStore::Clock::duration lease = 120s, size_t max_leased = 1)
        : store(keep, lease, max_leased) {
        service = custom ? std::move(custom) : std::make_unique<StateSyncService>(store, auth);
        int port = 0;
        grpc::ServerBuilder builder;
        builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
        builder.RegisterService(service.get());
        server = builder.BuildAndStart();
        address = "127.0.0.1:" + std::to_string(port);
    }
    void kill() { server->Shutdown(std::chrono::system_clock::now()); }
};

// Offers an honest manifest and corrupts every chunk it serves.
class LyingDonor final : public v1::StateSync::Service {
public:
    explicit LyingDonor(std::shared_ptr<const Snapshot> snapshot)
        : snapshot_(std::move(snapshot)) {}
    grpc::Status GetManifest(grpc::ServerContext*, const v1::GetManifestRequest*,
                             v1::SnapshotManifest* out) override {
        to_proto(snapshot_->manifest(), out);
        return grpc::Status::OK;
    }
    grpc::Status FetchChunk(grpc::ServerContext*, const v1::FetchChunkRequest* request,
                            v1::SnapshotChunk* out) override {
        const auto bytes = snapshot_->chunk(request->index());
        std::string data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
        data[data.size() / 2] ^= 1;
        out->set_index(request->index());
        out->set_data(data);
        return grpc::Status::OK;
    }

private:
    std::shared_ptr<const Snapshot> snapshot_;
};

// Serves honestly, each chunk (or probe) after `delay`: a donor behind a slow link.
class SlowDonor final : public v1::StateSync::Service {
public:
    SlowDonor(std::shared_ptr<const Snapshot> snapshot, std::chrono::milliseconds delay)
        : snapshot_(std::move(snapshot)), delay_(delay) {}
    grpc::Status GetManifest(grpc::ServerContext*, const v1::GetManifestRequest*,
                             v1::SnapshotManifest* out) override {
        to_proto(snapshot_->manifest(), out);
        return grpc::Status::OK;
    }
    grpc::Status FetchChunk(grpc::ServerContext*, const v1::FetchChunkRequest* request,
                            v1::SnapshotChunk* out) override {
        std::this_thread::sleep_for(delay_);
        auto bytes = snapshot_->chunk(request->index());
        if (request->max_bytes() > 0)
            bytes = bytes.first(std::min<size_t>(bytes.size(), request->max_bytes()));
        served_ += bytes.size();
        out->set_index(request->index());
        out->set_data(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
        return grpc::Status::OK;
    }
    uint64_t served() const { return served_.load(); }

private:
    std::shared_ptr<const Snapshot> snapshot_;
    std::chrono::milliseconds delay_;
    std::atomic<uint64_t> served_{0};
};

// Offers its manifest, then never answers a chunk until the caller gives up: a donor that froze
// (SIGSTOP, a hung disk) after the fetch began.
class FrozenDonor final : public v1::StateSync::Service {
public:
    explicit FrozenDonor(std::shared_ptr<const Snapshot> snapshot)
        : snapshot_(std::move(snapshot)) {}
    grpc::Status GetManifest(grpc::ServerContext*, const v1::GetManifestRequest*,
                             v1::SnapshotManifest* out) override {
        to_proto(snapshot_->manifest(), out);
        return grpc::Status::OK;
    }
    grpc::Status FetchChunk(grpc::ServerContext* context, const v1::FetchChunkRequest*,
                            v1::SnapshotChunk*) override {
        asked_++;
        while (!context->IsCancelled()) std::this_thread::sleep_for(10ms);
        return {grpc::StatusCode::CANCELLED, "frozen"};
    }
    int asked() const { return asked_.load(); }

private:
    std::shared_ptr<const Snapshot> snapshot_;
    std::atomic<int> asked_{0};
};

// Answers its manifest after `delay`, or with `delay` negative never until the caller gives up: a
// donor whose port drops connections, or one frozen before the fetch began. Chunks as an honest
// one.
class LateManifestDonor final : public v1::StateSync::Service {
public:
    LateManifestDonor(std::shared_ptr<const Snapshot> snapshot, std::chrono::milliseconds delay)
        : snapshot_(std::move(snapshot)), delay_(delay) {}
    grpc::Status GetManifest(grpc::ServerContext* context, const v1::GetManifestRequest*,
                             v1::SnapshotManifest* out) override {
        const auto until = std::chrono::steady_clock::now() + delay_;
        while (delay_ < 0ms || std::chrono::steady_clock::now() < until) {
            if (context->IsCancelled()) return {grpc::StatusCode::CANCELLED, "silent"};
            std::this_thread::sleep_for(10ms);
        }
        to_proto(snapshot_->manifest(), out);
        return grpc::Status::OK;
    }
    grpc::Status FetchChunk(grpc::ServerContext*, const v1::FetchChunkRequest* request,
                            v1::SnapshotChunk* out) override {
        const auto bytes = snapshot_->chunk(request->index());
        out->set_index(request->index());
        out->set_data(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
        return grpc::Status::OK;
    }

private:
    std::shared_ptr<const Snapshot> snapshot_;
    std::chrono::milliseconds delay_;
};

struct Joiner {
    NodeIdentity identity = NodeIdentity::generate();
    SwarmAuth auth{kSecret, identity};
    std::vector<std::byte> state = std::vector<std::byte>(kTotal);

    FetchResult fetch(const std::vector<std::string>& donors, FetchOptions options = {}) {
        options.call_timeout = 2000ms;
        return fetch_snapshot(donors, auth, grpc::InsecureChannelCredentials(),
                              {kFingerprint, kTotal}, state, options);
    }
};

}  // namespace

TEST_CASE("a joiner fetches the snapshot most donors hold, from all of them, verified") {
    const auto bytes = random_bytes(kTotal, 1);
    std::vector<std::unique_ptr<Donor>> donors;
    for (int i = 0; i < 3; ++i) {
        donors.push_back(std::make_unique<Donor>());
        donors.back()->store.publish(snapshot_of(bytes, 10));
    }
    donors.push_back(std::make_unique<Donor>());
    donors.back()->store.publish(snapshot_of(random_bytes(kTotal, 2), 11));  // newer, but alone

    Joiner joiner;
    std::vector<std::string> addresses;
    for (const auto& d : donors) addresses.push_back(d->address);
    const FetchResult result = joiner.fetch(addresses);
    REQUIRE(joiner.state == bytes);
    REQUIRE(result.manifest.round == 10);
    REQUIRE(result.manifest.metadata == "counters");
    REQUIRE(result.manifest.chunk_count() == 41);
    uint32_t total = 0, donors_used = 0;
    for (const auto& [address, count] : result.chunks_per_donor) {
        REQUIRE(address != donors[3]->address);
        total += count;
        donors_used += count > 0;
    }
    REQUIRE(total == 41);
    REQUIRE(donors_used >= 2);
}

TEST_CASE("a donor dying midway hands its chunks to the others") {
    const auto bytes = random_bytes(kTotal, 3);
    Donor a, b;
    a.store.publish(snapshot_of(bytes, 4));
    b.store.publish(snapshot_of(bytes, 4));
    Joiner joiner;
    std::future<void> killing;
    FetchOptions options;
    options.progress = [&](uint32_t done, uint32_t) {
        if (done == 10) killing = std::async(std::launch::async, [&] { a.kill(); });
    };
    const FetchResult result = joiner.fetch({a.address, b.address}, options);
    killing.wait();
    REQUIRE(joiner.state == bytes);
    REQUIRE(result.chunks_per_donor.at(b.address) > 0);
}

TEST_CASE(
    "when the only holder dies, the joiner moves to another snapshot and keeps unchanged chunks") {
    const auto old_bytes = random_bytes(kTotal, 4);
    auto new_bytes = old_bytes;
    for (uint64_t i = 30 * kChunk; i < kTotal; ++i)
        new_bytes[i] ^= std::byte{0x5a};  // chunks 30-40 differ
    Donor newest;
    newest.store.publish(snapshot_of(new_bytes, 9));
    // Two offers held by one donor each race with a probe of their first chunk; the older one's
    // donor is slower, so the newer is fetched first.
    Donor older(2, std::make_unique<SlowDonor>(snapshot_of(old_bytes, 8), 100ms));
    Joiner joiner;
    std::future<void> killing;
    std::atomic<uint32_t> reached{0};
    FetchOptions options;
    options.inflight_per_donor = 1;
    options.progress = [&](uint32_t done, uint32_t) {
        reached = done;
        if (done == 20) killing = std::async(std::launch::async, [&] { newest.kill(); });
    };
    const FetchResult result = joiner.fetch({newest.address, older.address}, options);
    killing.wait();
    REQUIRE(joiner.state == old_bytes);
    REQUIRE(result.manifest.round == 8);
    // Chunks 0-29 fetched from the newer snapshot are the same in the older one and were kept.
    const uint32_t from_newest = result.chunks_per_donor.at(newest.address);
    REQUIRE(from_newest >= 20);
    REQUIRE(result.chunks_per_donor.at(older.address) <= 41 - std::min<uint32_t>(from_newest, 30));
}

TEST_CASE("a donor that no longer holds the snapshot mid-fetch is asked again, not dropped") {
    const auto first = random_bytes(kTotal, 5);
    auto second = first;
    second[kTotal - 1] ^= std::byte{1};  // only the last chunk changes
    // The donors keep their newest snapshot only, not even one being read: as when another copy
    // holds the one older snapshot a donor keeps.
    Donor a(1, nullptr, 0s, 0), b(1, nullptr, 0s, 0);
    a.store.publish(snapshot_of(first, 1));
    b.store.publish(snapshot_of(first, 1));
    Joiner joiner;
    FetchOptions options;
    options.progress = [&](uint32_t done, uint32_t) {
        if (done == 10) {
            a.store.publish(snapshot_of(second, 2));
            b.store.publish(snapshot_of(second, 2));
        }
    };
    const FetchResult result = joiner.fetch({a.address, b.address}, options);
    REQUIRE(joiner.state == second);
    REQUIRE(result.manifest.round == 2);
}

TEST_CASE("past the newest it keeps, a store holds one snapshot being read, or else leased last") {
    std::vector<std::shared_ptr<const Snapshot>> published;
    for (uint64_t round = 1; round <= 5; round++)
        published.push_back(snapshot_of(random_bytes(kTotal, 100 + round), round));
    auto id = [&](int i) { return std::span<const unsigned char>(published[i]->manifest().id); };

    // A copy reading round 1 outranks the leases taken since: a manifest of round 2 and a finished
    // copy of it. Finished copies and manifests must not push out the snapshot a copy is reading.
    SnapshotStore store(2, 60s, 1);
    store.publish(published[0]);
    store.publish(published[1]);
    const auto reading = store.begin_read(id(0));
    REQUIRE(reading == published[0]);
    REQUIRE(store.lease_latest() == published[1]);
    store.end_read(store.begin_read(id(1)).get());
    store.publish(published[2]);
    store.publish(published[3]);
    CHECK(store.size() == 3);
    CHECK(store.find(id(0)) == published[0]);
    CHECK(store.find(id(1)) == nullptr);
    CHECK(store.latest() == published[3]);
    // Read no more, it stays for its lease.
    store.end_read(reading.get());
    store.publish(published[4]);
    CHECK(store.find(id(0)) == published[0]);
    CHECK(store.find(id(2)) == nullptr);

    // Among leases alone, the one that runs longest (taken last) stays.
    SnapshotStore leased(2, 60s, 1);
    leased.publish(published[0]);
    leased.publish(published[1]);
    leased.end_read(leased.begin_read(id(1)).get());
    std::this_thread::sleep_for(2ms);
    leased.end_read(leased.begin_read(id(0)).get());
    leased.publish(published[2]);
    leased.publish(published[3]);
    CHECK(leased.size() == 3);
    CHECK(leased.find(id(0)) == published[0]);
    CHECK(leased.find(id(1)) == nullptr);

    SnapshotStore expiring(2, 0s, 1);  // a lease of 0 has run out by the next publish
    expiring.publish(published[0]);
    const auto read = expiring.begin_read(id(0));
    expiring.publish(published[1]);
    expiring.publish(published[2]);
    CHECK(expiring.find(id(0)) == published[0]);  // still being read
    expiring.end_read(read.get());
    expiring.publish(published[3]);
    CHECK(expiring.size() == 2);
    CHECK(expiring.find(id(0)) == nullptr);
    CHECK(expiring.begin_read(id(0)) == nullptr);  // nothing to read once gone
}

TEST_CASE("a chunk call reads its snapshot until its answer has left, then lets it go") {
    Donor donor(1, nullptr, 0s);  // no lease after a read: only the read holds a snapshot
    const auto first = snapshot_of(random_bytes(kTotal, 41), 1);
    donor.store.publish(first);
    Joiner joiner;
    v1::FetchChunkRequest request;
    request.set_snapshot_id(first->manifest().id.data(), first->manifest().id.size());
    request.set_index(3);
    request.set_max_bytes(100);
    v1::SnapshotChunk chunk;
    grpc::ClientContext context;
    joiner.auth.attach(context, "FetchChunk");
    auto stub = v1::StateSync::NewStub(
        grpc::CreateChannel(donor.address, grpc::InsecureChannelCredentials()));
    REQUIRE(stub->FetchChunk(&context, request, &chunk).ok());
    const auto bytes = first->chunk(3);
    CHECK(chunk.data() == std::string(reinterpret_cast<const char*>(bytes.data()), 100));
    // The read ends when the call completes on the donor's side, just after the answer arrives.
    bool gone = false;
    for (uint64_t round = 2; round < 200 && !gone; round++) {
        donor.store.publish(snapshot_of(random_bytes(kChunk, round), round));
        gone = donor.store.find(first->manifest().id) == nullptr;
        if (!gone) std::this_thread::sleep_for(10ms);
    }
    CHECK(gone);
}

TEST_CASE("a slow copy finishes from its one donor though the donor publishes past its keep") {
    const auto first = random_bytes(kTotal, 12);
    Donor donor(2);
    donor.store.publish(snapshot_of(first, 1));
    Joiner joiner;
    FetchOptions options;
    std::mutex mutex;  // progress comes from the fetching threads
    uint64_t round = 1;
    // Three rounds pass during the copy: without the lease the snapshot is gone after the second.
    options.progress = [&](uint32_t done, uint32_t) {
        std::lock_guard lock(mutex);
        if (round < 4 && done >= 8 * round) {
            round++;
            donor.store.publish(snapshot_of(random_bytes(kTotal, 20 + round), round));
        }
    };
    const FetchResult result = joiner.fetch({donor.address}, options);
    CHECK(round == 4);
    CHECK(result.manifest.round == 1);
    CHECK(joiner.state == first);
    CHECK(result.chunks_per_donor.at(donor.address) == result.manifest.chunk_count());
}

TEST_CASE("offers of one donor each race with a probe, and the fastest donor's is fetched") {
    const auto fast_bytes = random_bytes(kTotal, 30);
    Donor fast;
    fast.store.publish(snapshot_of(fast_bytes, 4));
    // A newer snapshot, but each chunk takes a second: a donor behind a slow link. Before the race
    // the newest was fetched, 41 s of it.
    Donor slow(2, std::make_unique<SlowDonor>(snapshot_of(random_bytes(kTotal, 31), 5), 1000ms));
    Joiner joiner;
    const auto started = std::chrono::steady_clock::now();
    const FetchResult result = joiner.fetch({slow.address, fast.address});
    CHECK(std::chrono::steady_clock::now() - started < 10s);
    CHECK(result.manifest.round == 4);
    CHECK(joiner.state == fast_bytes);
    CHECK(result.chunks_per_donor.at(fast.address) == result.manifest.chunk_count());
    CHECK_FALSE(result.chunks_per_donor.contains(slow.address));
}

TEST_CASE("racers are asked for a probe, not their whole first chunk") {
    // Racers share the joiner's own link: over a slow one, three whole 1 MiB chunks cost more
    // than the copy they choose a donor for.
    const uint64_t total = 3 * uint64_t{kDefaultSnapshotChunkBytes};
    auto snapshot = [&](uint64_t seed, uint64_t round) {
        return std::make_shared<Snapshot>(kFingerprint, round, "counters",
                                          random_bytes(total, seed), kDefaultSnapshotChunkBytes);
    };
    Donor fast;
    fast.store.publish(snapshot(50, 4));
    auto slow_service = std::make_unique<SlowDonor>(snapshot(51, 5), 300ms);
    const SlowDonor& slow_state = *slow_service;
    Donor slow(2, std::move(slow_service));
    Joiner joiner;
    std::vector<std::byte> state(total);
    FetchOptions options;
    options.call_timeout = 2000ms;
    const FetchResult result =
        fetch_snapshot({slow.address, fast.address}, joiner.auth,
                       grpc::InsecureChannelCredentials(), {kFingerprint, total}, state, options);
    CHECK(result.manifest.round == 4);
    // The loser's handler finishes its probe after its delay, though the call was cancelled.
    for (int i = 0; i < 200 && slow_state.served() == 0; i++) std::this_thread::sleep_for(10ms);
    CHECK(slow_state.served() == kRaceProbeBytes);
}

TEST_CASE("a donor serving corrupt chunks is dropped and the honest one finishes") {
    const auto bytes = random_bytes(kTotal, 6);
    const auto snapshot = snapshot_of(bytes, 3);
    Donor honest;
    honest.store.publish(snapshot);
    Donor liar(2, std::make_unique<LyingDonor>(snapshot));
    Joiner joiner;
    const FetchResult result = joiner.fetch({liar.address, honest.address});
    REQUIRE(joiner.state == bytes);
    REQUIRE_FALSE(result.chunks_per_donor.contains(liar.address));
    REQUIRE(result.chunks_per_donor.at(honest.address) == 41);
}

TEST_CASE("manifests of another model, another size or a forged id are refused, naming why") {
    const auto snapshot = snapshot_of(random_bytes(kTotal, 7), 3);
    v1::SnapshotManifest manifest;
    to_proto(snapshot->manifest(), &manifest);
    REQUIRE_NOTHROW(check_manifest(manifest, {kFingerprint, kTotal}));
    const auto refused = [](const v1::SnapshotManifest& m, SnapshotExpectation e,
                            const char* words) {
        try {
            check_manifest(m, e);
            FAIL("accepted");
        } catch (const Error& error) {
            REQUIRE_THAT(error.what(), Catch::Contains(words));
        }
    };
    refused(manifest, {"another", kTotal}, "another model");
    refused(manifest, {kFingerprint, kTotal + 1}, "this node's state takes");
    auto forged = manifest;
    forged.set_round(99);
    refused(forged, {kFingerprint, kTotal}, "does not match its id");
    auto short_list = manifest;
    short_list.mutable_chunk_hashes()->RemoveLast();
    refused(short_list, {kFingerprint, kTotal}, "chunk hashes");
    auto huge_chunks = manifest;
    huge_chunks.set_chunk_bytes(kMaxSnapshotChunkBytes + 1);
    refused(huge_chunks, {kFingerprint, kTotal}, "chunk size");

    Donor other_model;
    other_model.store.publish(
        std::make_shared<Snapshot>("another", 3, "", random_bytes(kTotal, 8), kChunk));
    Joiner joiner;
    try {
        joiner.fetch({other_model.address});
        FAIL("fetched a snapshot of another model");
    } catch (const Error& e) {
        REQUIRE_THAT(e.what(),
                     Catch::Contains("no donor could deliver") && Catch::Contains("another model"));
    }
}

TEST_CASE("state sync calls need swarm credentials and name bad requests") {
    Donor donor;
    donor.store.publish(snapshot_of(random_bytes(kTotal, 9), 1));
    auto stub = v1::StateSync::NewStub(
        grpc::CreateChannel(donor.address, grpc::InsecureChannelCredentials()));
    v1::SnapshotManifest manifest;
    {
        grpc::ClientContext context;
        REQUIRE(stub->GetManifest(&context, {}, &manifest).error_code() ==
                grpc::StatusCode::UNAUTHENTICATED);
    }
    NodeIdentity identity = NodeIdentity::generate();
    SwarmAuth auth(kSecret, identity);
    {
        grpc::ClientContext context;
        auth.attach(context, "GetManifest");
        REQUIRE(stub->GetManifest(&context, {}, &manifest).ok());
    }
    v1::FetchChunkRequest request;
    v1::SnapshotChunk chunk;
    request.set_snapshot_id(manifest.snapshot_id());
    request.set_index(41);
    {
        grpc::ClientContext context;
        auth.attach(context, "FetchChunk");
        REQUIRE(stub->FetchChunk(&context, request, &chunk).error_code() ==
                grpc::StatusCode::OUT_OF_RANGE);
    }
    request.set_snapshot_id(std::string(32, 'x'));
    request.set_index(0);
    {
        grpc::ClientContext context;
        auth.attach(context, "FetchChunk");
        REQUIRE(stub->FetchChunk(&context, request, &chunk).error_code() ==
                grpc::StatusCode::NOT_FOUND);
    }
}

TEST_CASE("a donor slower than the first deadline is asked again with more time, not dropped") {
    // Four chunks, each served 300 ms late; the first deadline is 100 ms (the floor, with a
    // supposed link so fast that the rate gives less).
    const size_t total = 4 * kChunk;
    const auto bytes = random_bytes(total, 9);
    const auto snapshot = std::make_shared<Snapshot>(kFingerprint, 3, "counters", bytes, kChunk);
    Donor slow(2, std::make_unique<SlowDonor>(snapshot, 300ms));
    Joiner joiner;
    std::vector<std::byte> state(total);
    FetchOptions options;
    options.call_timeout = 100ms;
    options.max_call_timeout = 5000ms;
    options.min_rate_bytes_per_s = 1e12;
    const FetchResult result =
        fetch_snapshot({slow.address}, joiner.auth, grpc::InsecureChannelCredentials(),
                       {kFingerprint, total}, state, options);
    CHECK(state == bytes);
    CHECK(result.chunks_per_donor.at(slow.address) == 4);

    // With one try only, the same donor is dropped at its first timeout and nothing arrives.
    options.timeouts_per_donor = 1;
    CHECK_THROWS_WITH(
        fetch_snapshot({slow.address}, joiner.auth, grpc::InsecureChannelCredentials(),
                       {kFingerprint, total}, state, options),
        Catch::Contains("no donor could deliver"));
}

TEST_CASE("a donor that never offers a manifest holds the copy up for a grace, not its deadline") {
    const auto bytes = random_bytes(kTotal, 14);
    const auto snapshot = snapshot_of(bytes, 7);
    Donor silent(2, std::make_unique<LateManifestDonor>(snapshot, -1ms));
    Donor late(2, std::make_unique<LateManifestDonor>(snapshot, 300ms));
    Donor honest;
    honest.store.publish(snapshot);
    Joiner joiner;
    FetchOptions options;
    options.call_timeout = 60s;  // what the silent donor would otherwise hold the copy for
    options.max_call_timeout = 60s;
    const auto started = std::chrono::steady_clock::now();
    const FetchResult result = fetch_snapshot({silent.address, late.address, honest.address},
                                              joiner.auth, grpc::InsecureChannelCredentials(),
                                              {kFingerprint, kTotal}, joiner.state, options);
    CHECK(joiner.state == bytes);
    CHECK(std::chrono::steady_clock::now() - started < 30s);
    // The silent one is let go; one that offers within the grace (2 s past three times the first
    // offer's time) serves its share.
    CHECK(result.chunks_per_donor.count(silent.address) == 0);
    CHECK(result.chunks_per_donor.count(late.address) == 1);
    CHECK(result.chunks_per_donor.count(honest.address) == 1);
}

TEST_CASE("a donor that freezes mid-copy is let go when it is declared gone, not at its deadline") {
    const auto bytes = random_bytes(kTotal, 12);
    const auto snapshot = snapshot_of(bytes, 7);
    auto frozen_service = std::make_unique<FrozenDonor>(snapshot);
    FrozenDonor& frozen_state = *frozen_service;
    Donor frozen(2, std::move(frozen_service));
    Donor honest;
    honest.store.publish(snapshot);
    Joiner joiner;
    FetchOptions options;
    // Deadlines a frozen donor would hold its chunks for: a minute each.
    options.call_timeout = 60s;
    options.max_call_timeout = 60s;
    std::atomic<int> asked_about_frozen{0};
    options.donor_gone = [&](const std::string& donor) {
        if (donor != frozen.address) return false;
        return ++asked_about_frozen >= 3;  // the failure detector's verdict, a few checks in
    };
    const auto started = std::chrono::steady_clock::now();
    const FetchResult result = fetch_snapshot({frozen.address, honest.address}, joiner.auth,
                                              grpc::InsecureChannelCredentials(),
                                              {kFingerprint, kTotal}, joiner.state, options);
    CHECK(joiner.state == bytes);
    CHECK(frozen_state.asked() >= 1);  // it did hold chunks
    CHECK(result.chunks_per_donor.count(frozen.address) == 0);
    CHECK(result.chunks_per_donor.at(honest.address) == 41);
    // Its chunks came back when it was declared gone, far sooner than their 60 s deadline.
    CHECK(std::chrono::steady_clock::now() - started < 30s);
}

TEST_CASE(
    "an offer a judge refuses is dropped, naming its donor, and the fetch goes on with the next") {
    // The newest snapshot, held by two donors, would be fetched first; its metadata marks it bad.
    const auto bad_bytes = random_bytes(kTotal, 20), good_bytes = random_bytes(kTotal, 21);
    Donor bad_1, bad_2, good;
    for (Donor* d : {&bad_1, &bad_2})
        d->store.publish(std::make_shared<Snapshot>(kFingerprint, 12, "bad", bad_bytes, kChunk));
    good.store.publish(std::make_shared<Snapshot>(kFingerprint, 10, "good", good_bytes, kChunk));
    const std::vector<std::string> everyone = {bad_1.address, bad_2.address, good.address};
    Joiner joiner;

    SECTION("before fetching, from the manifests") {
        FetchOptions options;
        std::vector<size_t> offers_seen;
        options.refuse_offer =
            [&](const SnapshotOffer& offer,
                std::span<const SnapshotOffer> offers) -> std::optional<std::string> {
            offers_seen.push_back(offers.size());
            if (offer.manifest.metadata == "bad") return "it says bad";
            return std::nullopt;
        };
        const FetchResult result = joiner.fetch(everyone, options);
        CHECK(joiner.state == good_bytes);
        CHECK(result.manifest.metadata == "good");
        CHECK(result.chunks_per_donor.size() == 1);
        CHECK(offers_seen == std::vector<size_t>{2, 2});  // each offer judged beside both
    }
    SECTION("after fetching, from the bytes, and chunks of the refused one are not kept") {
        FetchOptions options;
        std::vector<std::vector<std::string>> refused;
        options.refuse_snapshot =
            [&](const SnapshotOffer& offer,
                std::span<const std::byte> bytes) -> std::optional<std::string> {
            if (!std::equal(bytes.begin(), bytes.end(), bad_bytes.begin())) return std::nullopt;
            refused.push_back(offer.donors);
            return "the bytes are bad";
        };
        const FetchResult result = joiner.fetch(everyone, options);
        CHECK(joiner.state == good_bytes);
        CHECK(result.manifest.metadata == "good");
        REQUIRE(refused.size() == 1);
        CHECK(refused.front().size() == 2);
    }
    SECTION("nothing acceptable left: the error names the donors and why") {
        FetchOptions options;
        options.refuse_offer = [](const SnapshotOffer& offer, std::span<const SnapshotOffer>) {
            return std::optional<std::string>("judged " + offer.manifest.metadata);
        };
        try {
            joiner.fetch(everyone, options);
            FAIL("fetched a refused snapshot");
        } catch (const Error& e) {
            REQUIRE_THAT(e.what(), Catch::Contains("no donor could deliver") &&
                                       Catch::Contains("from 127.0.0.1:") &&
                                       Catch::Contains("refused: judged"));
        }
    }
}

TEST_CASE("offers of donors refused before come after every other one") {
    // Two offers of one donor each: the newer one's donor was refused by an earlier copy, so the
    // older one is fetched without a race.
    const auto newer = random_bytes(kTotal, 22), older = random_bytes(kTotal, 23);
    Donor refused, fresh;
    refused.store.publish(snapshot_of(newer, 12));
    fresh.store.publish(snapshot_of(older, 10));
    Joiner joiner;
    FetchOptions options;
    options.refused_before = {refused.address};
    const FetchResult result = joiner.fetch({refused.address, fresh.address}, options);
    CHECK(joiner.state == older);
    CHECK(result.manifest.round == 10);
    // Alone, it is still asked.
    options.refused_before = {refused.address, fresh.address};
    joiner.fetch({refused.address}, options);
    CHECK(joiner.state == newer);
}
