// TOPK (codec/sparse.h): sizes and bytes against hand computation, the kept set against a sort,
// error-feedback accounting checked element by element, unbiased rounding, reproducibility across
// thread counts and cuts, and hostile input.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "codec/sparse.h"
#include "common/error.h"
#include "common/stochastic_rounding.h"
#include "kernels/cpu/cpu_ops.h"
#include "tests/support/random.h"

using namespace starling;
using namespace starling::codec;
using starling::test::random_vector;

namespace {

using Bytes = std::vector<std::byte>;

const RoundingKey kKey{0x5eed, 12, 3};

Bytes encode_new(const SparseFormat& f, const std::vector<float>& x, uint64_t first = 0,
                 const RoundingKey& key = kKey) {
    Bytes out(sparse_encoded_bytes(f, x.size()));
    sparse_encode(f, x, first, key, out);
    return out;
}

std::vector<float> decode_new(const SparseFormat& f, const Bytes& in, size_t n) {
    std::vector<float> out(n);
    sparse_decode(f, in, out);
    return out;
}

Bytes hex(std::initializer_list<unsigned> values) {
    Bytes b;
    for (unsigned v : values) b.push_back(std::byte(v));
    return b;
}

// The keep positions of a chunk with the largest |x|, ties to the lower index, by a full sort.
std::vector<size_t> top_positions(const std::vector<float>& x, size_t from, size_t len,
                                  size_t keep) {
    std::vector<size_t> order(len);
    std::iota(order.begin(), order.end(), from);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return std::fabs(x[a]) > std::fabs(x[b]); });
    order.resize(keep);
    std::sort(order.begin(), order.end());
    return order;
}

// The decoded chunk a hand-made TOPK chunk of 64 values (keep 2, 2-bit values) must give.
const SparseFormat kTiny{64, 2, 2};

std::vector<float> tiny_values() {
    std::vector<float> x(64, 0.5f);
    x[5] = 3.0f;
    x[40] = -1.0f;
    return x;
}

// lo 1.0, hi 3.0; positions 5 and 40 (5 low bits each: 5, 8; high parts 0 and 1 set bitmap
// bits 0 and 2 of 4); values: level 1 positive (code 2) and level 0 negative (code 1).
const Bytes kTinyBytes = hex({0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x40, 0x40, 0x05, 0x95, 0x01});

}  // namespace

TEST_CASE("TOPK formats and sizes by hand", "[codec][sparse]") {
    CHECK(sparse_format(4096, 0.015, 2) == SparseFormat{4096, 61, 2});
    CHECK(sparse_format(4096, 0.0001, 4) == SparseFormat{4096, 1, 4});
    CHECK(sparse_keep(SparseFormat{4096, 61, 2}, 100) == 2);  // ceil(61 * 100 / 4096)
    // Whole chunk: 6 low bits (4096 / 61 = 67), a bitmap of 61 + 64 bits, 2-bit values:
    // 61 * 8 + 125 = 613 bits, 77 bytes, plus the 8-byte range. The 100-value tail keeps 2:
    // 5 low bits, a bitmap of 2 + 4, 2 * 7 + 6 = 20 bits, 3 bytes, plus 8.
    CHECK(sparse_encoded_bytes(SparseFormat{4096, 61, 2}, 4096) == 85);
    CHECK(sparse_encoded_bytes(SparseFormat{4096, 61, 2}, 4196) == 85 + 11);
    CHECK(sparse_encoded_bytes(SparseFormat{4096, 61, 4}, 8192) ==
          2 * (8 + (61 * 10 + 125 + 7) / 8));
    CHECK(sparse_encoded_bytes(kTiny, 64) == 11);
    CHECK(sparse_encoded_bytes(kTiny, 0) == 0);
    // Every position kept: no low bits, a bitmap of 2 * 64 bits.
    CHECK(sparse_encoded_bytes(SparseFormat{64, 64, 2}, 64) == 8 + (64 * 2 + 128) / 8);

    CHECK_THROWS_WITH(check_sparse_format({32, 2, 2}), Catch::Contains("outside [64, 32768]"));
    CHECK_THROWS_WITH(check_sparse_format({65536, 2, 2}), Catch::Contains("outside"));
    CHECK_THROWS_WITH(check_sparse_format({64, 0, 2}), Catch::Contains("keeps 0 values"));
    CHECK_THROWS_WITH(check_sparse_format({64, 65, 2}), Catch::Contains("keeps 65 values"));
    CHECK_THROWS_WITH(check_sparse_format({64, 2, 1}), Catch::Contains("values of 1 bits"));
    CHECK_THROWS_WITH(check_sparse_format({64, 2, 9}), Catch::Contains("values of 9 bits"));
    CHECK_THROWS_WITH(sparse_format(4096, 0.0, 2), Catch::Contains("density"));
    CHECK_THROWS_WITH(sparse_format(4096, std::nan(""), 2), Catch::Contains("density"));
}

TEST_CASE("TOPK bytes of a hand-made chunk", "[codec][sparse][layout]") {
    const std::vector<float> x = tiny_values();
    // The two kept values sit exactly on levels, so no rounding noise can move them.
    for (uint64_t round = 0; round < 4; round++) {
        CHECK(encode_new(kTiny, x, 0, RoundingKey{1, round, 0}) == kTinyBytes);
    }
    std::vector<float> expected(64, 0.0f);
    expected[5] = 3.0f;
    expected[40] = -1.0f;
    CHECK(decode_new(kTiny, kTinyBytes, 64) == expected);
}

TEST_CASE("TOPK keeps each chunk's largest magnitudes, ties to the lower index",
          "[codec][sparse][roundtrip]") {
    const SparseFormat f{256, 7, 2};
    const size_t n = 256 * 5 + 100;  // a short tail keeps ceil(7 * 100 / 256) = 3
    auto x = random_vector<float>(n, 3, -2.0, 2.0);
    // Chunk 1 has ties at its threshold: the lower indices win.
    for (size_t i = 256; i < 512; i++) x[i] = (i % 3 == 0) ? 0.25f : 0.125f;
    x[300] = -0.75f;
    const std::vector<float> y = decode_new(f, encode_new(f, x), n);
    for (size_t c = 0; c * 256 < n; c++) {
        INFO("chunk " << c);
        const size_t from = c * 256, len = std::min<size_t>(256, n - from);
        const size_t keep = sparse_keep(f, len);
        const std::vector<size_t> kept = top_positions(x, from, len, keep);
        float lo = INFINITY, hi = 0.0f;
        for (size_t i : kept) {
            lo = std::min(lo, std::fabs(x[i]));
            hi = std::max(hi, std::fabs(x[i]));
        }
        for (size_t i = from; i < from + len; i++) {
            const bool is_kept = std::binary_search(kept.begin(), kept.end(), i);
            if (!is_kept) {
                CHECK(y[i] == 0.0f);
                continue;
            }
            // A kept value decodes to lo or hi (2 bits: one magnitude bit) with its sign.
            CHECK(std::signbit(y[i]) == std::signbit(x[i]));
            CHECK((std::fabs(y[i]) == lo || std::fabs(y[i]) == hi));
        }
    }
    CHECK(y[300] == -0.75f);  // the chunk's largest; with lo 0.25 its level is exact
}

TEST_CASE("TOPK error feedback: what was sent plus the residual is what went in",
          "[codec][sparse][feedback]") {
    const size_t n = 1024 * 6 + 300;
    for (uint32_t bits : {2u, 4u}) {
        for (float decay : {1.0f, 0.95f}) {
            INFO("bits " << bits << " decay " << decay);
            const SparseFormat f{1024, 15, bits};
            std::vector<float> residual(n, 0.0f);
            std::vector<double> sent(n, 0.0), total(n, 0.0), magnitude(n, 0.0);
            Bytes wire(sparse_encoded_bytes(f, n));
            bool exact = true, kept_count = true;
            for (uint64_t round = 0; round < 12; round++) {
                auto delta = random_vector<float>(n, 40 + round, -1.0, 1.0);
                for (size_t i = 0; i < n; i++)
                    delta[i] *= std::ldexp(1.0f, int(i / 512 % 5) * 3 - 9);
                std::vector<float> x(n);
                for (size_t i = 0; i < n; i++) x[i] = delta[i] + mul_rn(decay, residual[i]);
                const RoundingKey key{9, round, 1};
                sparse_encode_with_feedback(f, decay, delta, residual, 64, key, wire);
                CHECK(wire == encode_new(f, x, 64, key));  // the bytes of a plain encode of x
                const std::vector<float> y = decode_new(f, wire, n);
                size_t nonzero = 0;
                for (size_t i = 0; i < n; i++) {
                    exact = exact && residual[i] == x[i] - y[i];
                    nonzero += y[i] != 0.0f;
                    sent[i] += double(y[i]);
                    total[i] += double(delta[i]);
                    magnitude[i] += std::fabs(double(delta[i]));
                }
                kept_count = kept_count && nonzero == 6 * 15 + sparse_keep(f, 300);
            }
            CHECK(exact);
            CHECK(kept_count);
            if (decay == 1.0f) {
                // Nothing is lost: the sum of what was sent plus the residual is the sum of the
                // deltas, up to fp32 rounding of the running residual.
                double worst = 0.0;
                for (size_t i = 0; i < n; i++) {
                    worst = std::max(
                        worst, std::fabs(sent[i] + double(residual[i]) - total[i]) / magnitude[i]);
                }
                CHECK(worst < 1e-5);
            }
        }
    }
}

TEST_CASE("TOPK rounding between magnitudes is unbiased", "[codec][sparse][unbiased]") {
    // Every value of the chunk is kept, so the kept set never changes; magnitudes spread over
    // [0.5, 2] sit between levels of the 2-bit (two levels) and 4-bit (eight levels) grids.
    const size_t n = 64;
    auto x = random_vector<float>(n, 11, 0.5, 2.0);
    x[0] = 0.5f;
    x[1] = -2.0f;
    for (uint32_t bits : {2u, 4u}) {
        INFO("bits " << bits);
        const SparseFormat f{64, 64, bits};
        const int trials = 4000;
        std::vector<double> mean(n, 0.0);
        for (int t = 0; t < trials; t++) {
            const std::vector<float> y =
                decode_new(f, encode_new(f, x, 0, RoundingKey{2, uint64_t(t), 0}), n);
            for (size_t i = 0; i < n; i++) mean[i] += double(y[i]) / trials;
        }
        const double step = 1.5 / double((1u << (bits - 1)) - 1);
        double worst = 0.0;
        for (size_t i = 0; i < n; i++) worst = std::max(worst, std::fabs(mean[i] - x[i]) / step);
        // The standard error of a mean of 4000 draws of at most step / 2 spread is 0.008 step.
        CHECK(worst < 0.04);
    }
}

TEST_CASE("TOPK bytes do not depend on threads or on how the span is cut",
          "[codec][sparse][reproducible][threads]") {
    const SparseFormat f = sparse_format(4096, 0.015, 2);
    const size_t n = 4096 * 40 + 777;  // past the parallel threshold
    auto x = random_vector<float>(n, 23, -1.0, 1.0);
    const int previous = cpu_threads();
    set_cpu_threads(1);
    const Bytes one = encode_new(f, x, 4096 * 3);
    set_cpu_threads(2);
    const Bytes two = encode_new(f, x, 4096 * 3);
    CHECK(one == two);
    const std::vector<float> back = decode_new(f, two, n);
    set_cpu_threads(1);
    CHECK(decode_new(f, one, n) == back);
    set_cpu_threads(previous);

    // Chunks 10 to 19 alone give the same bytes as the same chunks of the whole span.
    const size_t chunk_bytes = sparse_encoded_bytes(f, 4096);
    const std::vector<float> part(x.begin() + 4096 * 10, x.begin() + 4096 * 20);
    const Bytes part_bytes = encode_new(f, part, 4096 * 13);
    CHECK(part_bytes == Bytes(one.begin() + ptrdiff_t(10 * chunk_bytes),
                              one.begin() + ptrdiff_t(20 * chunk_bytes)));
    CHECK(encode_new(f, x, 4096 * 3, RoundingKey{1, 12, 3}) != one);
}

TEST_CASE("TOPK decode refuses hostile input, naming the chunk and the problem",
          "[codec][sparse][hostile]") {
    auto refuses = [](const SparseFormat& f, const Bytes& b, size_t n, const std::string& what) {
        std::vector<float> out(n);
        CHECK_THROWS_WITH(sparse_decode(f, b, out), Catch::Contains(what));
    };
    auto altered = [](size_t at, unsigned value) {
        Bytes b = kTinyBytes;
        b[at] = std::byte(value);
        return b;
    };
    refuses(kTiny, Bytes(10), 64, "10 bytes of TOPK data for 64 values, which take 11");
    refuses(kTiny, altered(3, 0x7f), 64,  // lo = 0x7f800000, Inf
            "chunk 0 (elements 0 to 63) has a magnitude range that is NaN, Inf, negative");
    refuses(kTiny, altered(3, 0xbf), 64, "magnitude range");                   // lo = -1
    refuses(kTiny, altered(7, 0x3f), 64, "magnitude range");                   // hi = 0.75 < lo = 1
    refuses(kTiny, altered(9, 0x9d), 64, "marks more than its 2 positions");   // bitmap bit 11
    refuses(kTiny, altered(9, 0x85), 64, "marks fewer than its 2 positions");  // bit 12 cleared
    refuses(kTiny, altered(10, 0x81), 64, "has non-zero padding bits");
    // Both positions 5 (low bits 5 and 5, both in bucket 0): a repeat.
    Bytes repeated = kTinyBytes;
    repeated[8] = std::byte(0xa5);
    repeated[9] = std::byte(0x8c);
    refuses(kTiny, repeated, 64, "has a position repeated or out of order");
    // A 40-value tail (4 low bits, buckets 0 to 2): bucket 2, low 15 is position 47.
    std::vector<float> tail(40, 0.5f);
    tail[3] = 2.0f;
    tail[30] = 1.0f;
    Bytes past = encode_new(kTiny, tail);
    past[8] = std::byte((unsigned(past[8]) & 0x0f) | 0xf0);
    past[9] = std::byte((unsigned(past[9]) & 0xe0) | 0x09);
    refuses(kTiny, past, 40, "has a position past its end");

    // A bad chunk in a longer span is named by its index and elements.
    std::vector<float> x(64 * 4, 0.25f);
    for (size_t c = 0; c < 4; c++) x[c * 64 + 9] = 1.0f;
    Bytes four = encode_new(kTiny, x);
    four[2 * 11 + 3] = std::byte(0xff);
    refuses(kTiny, four, 256, "TOPK chunk 2 (elements 128 to 191)");
}

TEST_CASE("TOPK encode refuses NaN and Inf, wrong sizes and a bad decay",
          "[codec][sparse][hostile]") {
    std::vector<float> x(64 * 3, 0.5f);
    x[64 + 7] = NAN;
    Bytes out(sparse_encoded_bytes(kTiny, x.size()));
    CHECK_THROWS_WITH(sparse_encode(kTiny, x, 0, kKey, out),
                      Catch::Contains("TOPK chunk 1 (elements 64 to 127) holds a NaN or Inf"));
    x[64 + 7] = INFINITY;
    CHECK_THROWS_WITH(sparse_encode(kTiny, x, 0, kKey, out), Catch::Contains("NaN or Inf"));
    x[64 + 7] = 0.5f;
    Bytes short_out(out.size() - 1);
    CHECK_THROWS_WITH(sparse_encode(kTiny, x, 0, kKey, short_out),
                      Catch::Contains("bytes of TOPK data for 192 values"));
    std::vector<float> residual(x.size() - 1);
    CHECK_THROWS_WITH(sparse_encode_with_feedback(kTiny, 0.9f, x, residual, 0, kKey, out),
                      Catch::Contains("residual of 191 values"));
    residual.resize(x.size());
    CHECK_THROWS_WITH(sparse_encode_with_feedback(kTiny, 1.5f, x, residual, 0, kKey, out),
                      Catch::Contains("decay"));
    // A residual that turns a finite delta into Inf is refused like the delta itself.
    residual[3] = 3e38f;
    x[3] = 3e38f;
    CHECK_THROWS_WITH(sparse_encode_with_feedback(kTiny, 1.0f, x, residual, 0, kKey, out),
                      Catch::Contains("TOPK chunk 0"));
}

TEST_CASE("TOPK of all zeros and of magnitudes near FLT_MAX stays finite",
          "[codec][sparse][roundtrip]") {
    const SparseFormat f{64, 8, 4};
    const std::vector<float> zeros(64 * 2, 0.0f);
    CHECK(decode_new(f, encode_new(f, zeros), zeros.size()) == zeros);
    // lo + 7 * step can round past hi = FLT_MAX; decoding clamps every magnitude to hi.
    auto big = random_vector<float>(64, 5, 0.9, 1.0);
    for (float& v : big) v *= 3.4e38f;
    big[0] = FLT_MAX;
    const std::vector<float> y = decode_new(f, encode_new(f, big), 64);
    for (float v : y) CHECK(std::isfinite(v));
    CHECK(*std::max_element(y.begin(), y.end()) >= 0.99f * FLT_MAX);
}
