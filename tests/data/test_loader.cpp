#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "data/loader.h"
#include "data/shard.h"
#include "test_util.h"

using Catch::Matchers::Contains;

namespace Catch {
template <>
struct StringMaker<starling::LoaderState> {
    static std::string convert(const starling::LoaderState& s) {
        return "{epoch " + std::to_string(s.epoch) + ", position " + std::to_string(s.position) +
               "}";
    }
};
}  // namespace Catch
using namespace starling::test;

namespace {

struct Dataset {
    std::vector<std::string> paths;
    std::vector<std::vector<uint16_t>> shards;
};

Dataset write_dataset(const TempDir& dir, const std::vector<std::vector<uint16_t>>& shards) {
    Dataset d;
    d.shards = shards;
    for (size_t i = 0; i < shards.size(); ++i) {
        d.paths.push_back(dir.file("train_00000" + std::to_string(i) + ".bin"));
        starling::write_shard(d.paths.back(), shards[i]);
    }
    return d;
}

// Shards whose token at global position p is p, so a window's first token names the window.
Dataset write_counting_dataset(const TempDir& dir, const std::vector<size_t>& sizes) {
    std::vector<std::vector<uint16_t>> shards;
    uint16_t next = 0;
    for (size_t n : sizes) {
        std::vector<uint16_t> tokens(n);
        for (auto& t : tokens) t = next++;
        shards.push_back(tokens);
    }
    return write_dataset(dir, shards);
}

// Every window of T+1 tokens at stride T inside each shard, in dataset order, as the token lists
// the loader should produce: an independent enumeration of the expected sequences.
std::vector<std::vector<uint16_t>> expected_windows(const Dataset& d, int T) {
    std::vector<std::vector<uint16_t>> windows;
    for (const auto& shard : d.shards) {
        for (size_t start = 0; start + size_t(T) + 1 <= shard.size(); start += size_t(T)) {
            windows.emplace_back(shard.begin() + long(start), shard.begin() + long(start) + T + 1);
        }
    }
    return windows;
}

// Rows of the next `batches` batches, each row as its T+1 tokens (inputs then the last target),
// after checking that targets are the inputs shifted by one.
std::vector<std::vector<uint16_t>> take_rows(starling::DataLoader& loader, size_t batches) {
    const int B = loader.options().B;
    const int T = loader.options().T;
    std::vector<int32_t> inputs(size_t(B * T)), targets(size_t(B * T));
    std::vector<std::vector<uint16_t>> rows;
    for (size_t i = 0; i < batches; ++i) {
        std::fill(inputs.begin(), inputs.end(), -1);
        std::fill(targets.begin(), targets.end(), -1);
        loader.next_batch(inputs.data(), targets.data());
        for (int b = 0; b < B; ++b) {
            std::vector<uint16_t> row;
            for (int t = 0; t < T; ++t) {
                const int32_t x = inputs[size_t(b * T + t)];
                REQUIRE(x >= 0);
                REQUIRE(x <= 65535);
                row.push_back(uint16_t(x));
                if (t > 0) REQUIRE(targets[size_t(b * T + t - 1)] == x);
            }
            const int32_t last = targets[size_t(b * T + T - 1)];
            REQUIRE(last >= 0);
            REQUIRE(last <= 65535);
            row.push_back(uint16_t(last));
            rows.push_back(row);
        }
    }
    return rows;
}

// Rows covering the first `epochs` epochs exactly (enough batches, then trimmed).
std::vector<std::vector<uint16_t>> take_epochs(starling::DataLoader& loader, size_t epochs) {
    const size_t rows = loader.sequences_per_epoch() * epochs;
    const size_t B = size_t(loader.options().B);
    std::vector<std::vector<uint16_t>> out = take_rows(loader, (rows + B - 1) / B);
    out.resize(rows);
    return out;
}

std::vector<uint16_t> first_tokens(const std::vector<std::vector<uint16_t>>& rows, size_t begin,
                                   size_t end) {
    std::vector<uint16_t> out;
    for (size_t i = begin; i < end; ++i) out.push_back(rows[i][0]);
    return out;
}

starling::DataLoaderOptions make_options(const Dataset& d, int B, int T) {
    starling::DataLoaderOptions o;
    o.shard_paths = d.paths;
    o.B = B;
    o.T = T;
    return o;
}

}  // namespace

TEST_CASE("loader: sequential batches are the shifted windows of the raw shards",
          "[data][loader]") {
    TempDir dir;
    // High token values check that uint16 widens to int32 without sign extension.
    const Dataset d = write_dataset(
        dir,
        {pseudo_random_tokens(203, 1), pseudo_random_tokens(150, 2), pseudo_random_tokens(97, 3)});
    const int B = 3, T = 8;
    const auto windows = expected_windows(d, T);
    REQUIRE(windows.size() == 25 + 18 + 12);

    auto options = make_options(d, B, T);
    options.shuffle = false;
    starling::DataLoader loader(options);
    CHECK(loader.sequences_per_epoch() == windows.size());
    CHECK(loader.total_sequences() == windows.size());

    // 19 batches = 57 rows: the whole epoch, then the first two windows again.
    const auto rows = take_rows(loader, 19);
    for (size_t r = 0; r < rows.size(); ++r) {
        INFO("row " << r);
        REQUIRE(rows[r] == windows[r % windows.size()]);
    }
    CHECK(loader.state() == starling::LoaderState{1, 2});

    SECTION("inputs and targets exactly, as int32") {
        starling::DataLoader fresh(options);
        std::vector<int32_t> inputs(B * T), targets(B * T);
        fresh.next_batch(inputs.data(), targets.data());
        for (int b = 0; b < B; ++b) {
            for (int t = 0; t < T; ++t) {
                CHECK(inputs[size_t(b * T + t)] == int32_t(d.shards[0][size_t(b * T + t)]));
                CHECK(targets[size_t(b * T + t)] == int32_t(d.shards[0][size_t(b * T + t + 1)]));
            }
        }
        const bool has_high =
            std::any_of(inputs.begin(), inputs.end(), [](int32_t x) { return x >= 32768; });
        CHECK(has_high);
    }
}

TEST_CASE("loader: with shuffle every sequence appears once per epoch", "[data][loader]") {
    TempDir dir;
    const Dataset d = write_counting_dataset(dir, {1000, 777, 513});
    const int B = 5, T = 16;
    const auto windows = expected_windows(d, T);
    std::vector<uint16_t> all_starts;
    for (const auto& w : windows) all_starts.push_back(w[0]);

    auto options = make_options(d, B, T);
    options.node_id = 42;
    starling::DataLoader loader(options);
    REQUIRE(loader.sequences_per_epoch() == windows.size());
    const size_t n = windows.size();

    const auto rows = take_epochs(loader, 3);
    for (const auto& row : rows) {
        // Each row is one of the expected windows (the first token names it).
        auto it = std::find_if(windows.begin(), windows.end(),
                               [&](const auto& w) { return w[0] == row[0]; });
        REQUIRE(it != windows.end());
        REQUIRE(row == *it);
    }
    std::vector<std::vector<uint16_t>> orders;
    for (size_t e = 0; e < 3; ++e) {
        std::vector<uint16_t> order = first_tokens(rows, e * n, (e + 1) * n);
        std::vector<uint16_t> sorted = order;
        std::sort(sorted.begin(), sorted.end());
        INFO("epoch " << e);
        CHECK(sorted == all_starts);  // each sequence exactly once
        CHECK(order != all_starts);   // and not in file order
        orders.push_back(order);
    }
    CHECK(orders[0] != orders[1]);  // a new permutation each epoch
    CHECK(orders[1] != orders[2]);
    // take_epochs ran whole batches: ceil(3n / B) * B rows, past the end of epoch 2.
    const size_t consumed = (3 * n + size_t(B) - 1) / size_t(B) * size_t(B);
    CHECK(loader.state() == starling::LoaderState{3, consumed - 3 * n});
}

TEST_CASE("loader: the node id seeds the order", "[data][loader]") {
    TempDir dir;
    const Dataset d = write_counting_dataset(dir, {2000});
    auto options = make_options(d, 4, 16);

    auto epoch_order = [&](uint64_t node) {
        options.node_id = node;
        starling::DataLoader loader(options);
        return first_tokens(take_epochs(loader, 1), 0, loader.sequences_per_epoch());
    };
    const auto a = epoch_order(1);
    const auto b = epoch_order(2);
    CHECK(a != b);
    CHECK(epoch_order(1) == a);  // deterministic
    std::vector<uint16_t> sa = a, sb = b;
    std::sort(sa.begin(), sa.end());
    std::sort(sb.begin(), sb.end());
    CHECK(sa == sb);  // same sequences, different order
}

TEST_CASE("loader: partitions are disjoint, cover everything and ignore the node id",
          "[data][loader]") {
    TempDir dir;
    const Dataset d = write_counting_dataset(dir, {1200, 900, 300});
    const int B = 4, T = 16;
    const auto windows = expected_windows(d, T);
    std::set<uint16_t> all;
    for (const auto& w : windows) all.insert(w[0]);
    REQUIRE(all.size() == windows.size());

    const uint32_t count = 3;
    std::vector<std::set<uint16_t>> parts;
    size_t total = 0;
    for (uint32_t p = 0; p < count; ++p) {
        auto options = make_options(d, B, T);
        options.partition_index = p;
        options.partition_count = count;
        options.node_id = 100 + p;
        starling::DataLoader loader(options);
        CHECK(loader.total_sequences() == windows.size());
        const auto rows = take_epochs(loader, 1);
        const auto starts = first_tokens(rows, 0, rows.size());
        std::set<uint16_t> part(starts.begin(), starts.end());
        CHECK(part.size() == starts.size());  // no repeats inside the epoch
        // Roughly a third each (149 sequences: expected ~50, std ~6).
        CHECK(part.size() > windows.size() / 5);
        CHECK(part.size() < windows.size() / 2);
        total += part.size();
        parts.push_back(part);

        // Another node, sequential or shuffled, gets the same subset.
        options.node_id = 7;
        options.shuffle = false;
        starling::DataLoader other(options);
        const auto other_rows = take_epochs(other, 1);
        const auto other_starts = first_tokens(other_rows, 0, other_rows.size());
        CHECK(std::set<uint16_t>(other_starts.begin(), other_starts.end()) == part);
        CHECK(std::is_sorted(other_starts.begin(), other_starts.end()));
    }
    CHECK(total == windows.size());
    std::set<uint16_t> uni;
    for (const auto& part : parts) uni.insert(part.begin(), part.end());
    CHECK(uni == all);  // together they cover everything; with total == size, also disjoint
    for (uint32_t p = 0; p < count; ++p) {
        for (uint32_t q = p + 1; q < count; ++q) {
            std::vector<uint16_t> common;
            std::set_intersection(parts[p].begin(), parts[p].end(), parts[q].begin(),
                                  parts[q].end(), std::back_inserter(common));
            CHECK(common.empty());
        }
    }
}

TEST_CASE("loader: state and restore reproduce the following batches exactly", "[data][loader]") {
    TempDir dir;
    const Dataset d = write_counting_dataset(dir, {200, 180});  // 12 + 11 = 23 sequences of T = 16
    auto options = make_options(d, 4, 16);
    options.node_id = 7;

    starling::DataLoader straight(options);
    REQUIRE(straight.sequences_per_epoch() == 23);
    const auto expected = take_rows(straight, 10);  // 40 rows: crosses into epoch 1
    CHECK(straight.state() == starling::LoaderState{1, 17});

    starling::DataLoader first(options);
    auto rows = take_rows(first, 4);
    const starling::LoaderState saved = first.state();
    CHECK(saved == starling::LoaderState{0, 16});

    starling::DataLoader resumed(options);
    resumed.restore(saved);
    CHECK(resumed.state() == saved);
    const auto rest = take_rows(resumed, 6);
    rows.insert(rows.end(), rest.begin(), rest.end());
    CHECK(rows == expected);
    CHECK(resumed.state() == straight.state());

    SECTION("restoring into a later epoch matches running there") {
        starling::DataLoader runner(options);
        take_rows(runner, 23);  // 92 rows = 4 epochs exactly
        REQUIRE(runner.state() == starling::LoaderState{4, 0});
        starling::DataLoader jumper(options);
        jumper.restore({4, 0});
        CHECK(take_rows(jumper, 3) == take_rows(runner, 3));
    }
    SECTION("a position outside the epoch is rejected") {
        starling::DataLoader loader(options);
        CHECK_THAT(error_message([&] {
                       loader.restore({0, 23});
                   }),
                   Contains(d.paths[0]) && Contains("position 23") && Contains("only 23"));
        CHECK_THAT(error_message([&] { loader.restore({2, 1000}); }), Contains("position 1000"));
        CHECK(loader.state() == starling::LoaderState{0, 0});  // unchanged
    }
}

TEST_CASE("loader: validation order is sequential and reset repeats it", "[data][loader]") {
    TempDir dir;
    const Dataset d = write_counting_dataset(dir, {500, 300});
    auto options = make_options(d, 2, 32);
    options.shuffle = false;
    options.node_id = 99;  // irrelevant without shuffle
    const auto windows = expected_windows(d, 32);

    starling::DataLoader val(options);
    const auto first = take_rows(val, 5);
    for (size_t r = 0; r < first.size(); ++r) CHECK(first[r] == windows[r]);
    take_rows(val, 3);
    val.reset();
    CHECK(val.state() == starling::LoaderState{0, 0});
    CHECK(take_rows(val, 5) == first);

    // reset on a shuffled loader also returns to the first batches of epoch 0.
    options.shuffle = true;
    starling::DataLoader train(options);
    const auto a = take_rows(train, 4);
    take_rows(train, 20);
    train.reset();
    CHECK(take_rows(train, 4) == a);
}

TEST_CASE("loader: errors name the problem", "[data][loader]") {
    TempDir dir;
    const int T = 16;
    const Dataset d = write_counting_dataset(dir, {100, size_t(T), 50});  // the second is too short

    SECTION("a shard shorter than T+1 tokens") {
        auto options = make_options(d, 1, T);
        CHECK_THAT(error_message([&] { starling::DataLoader loader(options); }),
                   Contains(d.paths[1]) && Contains("too short") && Contains("16 tokens") &&
                       Contains("17"));
    }
    SECTION("exactly T+1 tokens is one sequence") {
        TempDir other;
        const Dataset e = write_counting_dataset(other, {size_t(T) + 1});
        starling::DataLoader loader(make_options(e, 1, T));
        CHECK(loader.sequences_per_epoch() == 1);
        const auto rows = take_rows(loader, 2);
        CHECK(rows[0] == e.shards[0]);
        CHECK(rows[1] == e.shards[0]);
    }
    SECTION("a partition with fewer than B sequences") {
        const Dataset e = write_counting_dataset(dir, {100, 50});  // 6 + 3 = 9 sequences
        CHECK(starling::DataLoader(make_options(e, 9, T)).sequences_per_epoch() == 9);
        CHECK_THAT(error_message([&] { starling::DataLoader loader(make_options(e, 10, T)); }),
                   Contains("holds 9 sequences") && Contains("fewer than B = 10"));
        auto options = make_options(e, 5, T);
        options.partition_count = 2;
        CHECK_THAT(error_message([&] { starling::DataLoader loader(options); }),
                   Contains("fewer than B = 5"));
    }
    SECTION("bad options") {
        const Dataset e = write_counting_dataset(dir, {100});
        auto options = make_options(e, 0, T);
        CHECK_THAT(error_message([&] { starling::DataLoader loader(options); }), Contains("B = 0"));
        options.B = 1;
        options.T = 0;
        CHECK_THAT(error_message([&] { starling::DataLoader loader(options); }), Contains("T = 0"));
        options.T = T;
        options.partition_index = 2;
        options.partition_count = 2;
        CHECK_THAT(error_message([&] { starling::DataLoader loader(options); }),
                   Contains("partition index 2"));
        options.partition_index = 0;
        options.partition_count = 0;
        CHECK_THAT(error_message([&] { starling::DataLoader loader(options); }),
                   Contains("partition"));
        options.partition_count = 1;
        options.shard_paths.clear();
        CHECK_THAT(error_message([&] { starling::DataLoader loader(options); }),
                   Contains("no shard"));
        options.shard_paths = {dir.file("missing.bin")};
        CHECK_THAT(error_message([&] { starling::DataLoader loader(options); }),
                   Contains(dir.file("missing.bin")) && Contains("no such file"));
    }
}
