// safetensors read/write. Corrupt files are built by hand byte by byte, so the reader is checked
// against the format, not against our own writer.
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "model/safetensors.h"
#include "tests/support/files.h"

namespace fs = std::filesystem;
using namespace starling;
using namespace starling::test;

namespace {

std::string le64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
}

// A safetensors image from a header text and a data block, with the true header length
// unless one is given.
std::string image(const std::string& header, const std::string& data,
                  std::optional<uint64_t> len = {}) {
    return le64(len.value_or(header.size())) + header + data;
}

// Opening the file must throw starling::Error naming the file and containing `word`.
void expect_open_error(const fs::path& p, const std::string& word) {
    INFO("file " << p << ", expecting an error mentioning '" << word << "'");
    try {
        (void)SafetensorsFile::open(p);
        FAIL_CHECK("no exception");
    } catch (const Error& e) {
        std::string msg = e.what();
        INFO("message: " << msg);
        CHECK(msg.find(p.string()) != std::string::npos);
        CHECK(msg.find(word) != std::string::npos);
    }
}

void expect_corrupt(const fs::path& dir, const std::string& name, const std::string& bytes,
                    const std::string& word) {
    fs::path p = dir / (name + ".safetensors");
    put(p, bytes);
    expect_open_error(p, word);
}

std::string f32_bytes(std::initializer_list<float> v) {
    std::string s(v.size() * 4, '\0');
    std::memcpy(s.data(), std::data(v), s.size());
    return s;
}

}  // namespace

TEST_CASE("safetensors: dtype table", "[safetensors]") {
    const std::vector<std::tuple<DType, std::string, size_t>> expected = {
        {DType::F32, "F32", 4}, {DType::F64, "F64", 8}, {DType::BF16, "BF16", 2},
        {DType::F16, "F16", 2}, {DType::I32, "I32", 4}, {DType::I64, "I64", 8},
        {DType::U8, "U8", 1},   {DType::U64, "U64", 8},
    };
    for (const auto& [dt, name, size] : expected) {
        CHECK(dtype_name(dt) == name);
        CHECK(dtype_size(dt) == size);
        REQUIRE(dtype_from_name(name).has_value());
        CHECK(*dtype_from_name(name) == dt);
    }
    CHECK_FALSE(dtype_from_name("f32").has_value());
    CHECK_FALSE(dtype_from_name("BOOL").has_value());
    CHECK(shape_string({}) == "[]");
    CHECK(shape_string({2, 3}) == "[2,3]");
}

TEST_CASE("safetensors: round trip of several dtypes, shapes and metadata", "[safetensors]") {
    TempDir tmp;
    const fs::path p = tmp.path() / "model.safetensors";

    std::vector<float> w(2 * 3 * 4);
    for (size_t i = 0; i < w.size(); ++i) w[i] = 0.5f * static_cast<float>(i) - 3.25f;
    const double scalar = -1.0 / 3.0;
    const std::vector<uint16_t> bf16 = {0x3f80, 0xbf80, 0x7f80, 0x0001, 0x4049};
    const std::vector<uint16_t> f16 = {0x3c00, 0xc000};
    const std::vector<int32_t> i32 = {INT32_MIN, -1, 0, INT32_MAX};
    const std::vector<int64_t> i64 = {INT64_MIN, 42, INT64_MAX};
    const std::vector<uint8_t> u8 = {0, 1, 127, 128, 255, 7, 9};
    const std::vector<uint64_t> u64 = {UINT64_MAX, 0x0123456789abcdefull};
    const std::map<std::string, std::string> meta = {
        {"format", "pt"}, {"step", "1200"}, {"note", "ünïcode ✓"}};

    write_safetensors(
        p,
        {
            {"blocks.0.w", DType::F32, {2, 3, 4}, w.data()},
            {"scalar", DType::F64, {}, &scalar},
            {"bf16", DType::BF16, {5}, bf16.data()},
            {"f16", DType::F16, {1, 2}, f16.data()},
            {"i32", DType::I32, {2, 2}, i32.data()},
            {"i64", DType::I64, {3}, i64.data()},
            {"u8", DType::U8, {7, 1}, u8.data()},  // odd size: later tensors unaligned
            {"u64", DType::U64, {2}, u64.data()},
            {"empty", DType::F32, {0, 5}, nullptr},
        },
        meta);

    SafetensorsFile f = SafetensorsFile::open(p);
    CHECK(f.path() == p);
    CHECK(f.metadata() == meta);
    CHECK(f.names() == std::vector<std::string>{"blocks.0.w", "scalar", "bf16", "f16", "i32", "i64",
                                                "u8", "u64", "empty"});
    CHECK(f.has("u8"));
    CHECK_FALSE(f.has("u9"));

    std::vector<float> w_back(w.size());
    f.read_f32("blocks.0.w", w_back, {2, 3, 4});
    CHECK(w_back == w);

    const TensorEntry& s = f.get("scalar");
    CHECK(s.dtype == DType::F64);
    CHECK(s.shape.empty());
    CHECK(s.numel() == 1);
    REQUIRE(s.bytes.size() == 8);
    double scalar_back = 0;
    std::memcpy(&scalar_back, s.bytes.data(), 8);
    CHECK(scalar_back == scalar);

    auto check_raw = [&](const std::string& name, DType dt, std::vector<int64_t> shape,
                         const void* data, size_t nbytes) {
        INFO(name);
        const TensorEntry& e = f.get(name);
        CHECK(e.name == name);
        CHECK(e.dtype == dt);
        CHECK(e.shape == shape);
        REQUIRE(e.bytes.size() == nbytes);
        CHECK(std::memcmp(e.bytes.data(), data, nbytes) == 0);
        std::vector<std::byte> copy(nbytes);
        f.read(name, dt, shape, copy);
        CHECK(std::memcmp(copy.data(), data, nbytes) == 0);
    };
    check_raw("bf16", DType::BF16, {5}, bf16.data(), 10);
    check_raw("f16", DType::F16, {1, 2}, f16.data(), 4);
    check_raw("i32", DType::I32, {2, 2}, i32.data(), 16);
    check_raw("i64", DType::I64, {3}, i64.data(), 24);
    check_raw("u8", DType::U8, {7, 1}, u8.data(), 7);
    check_raw("u64", DType::U64, {2}, u64.data(), 16);

    const TensorEntry& empty = f.get("empty");
    CHECK(empty.numel() == 0);
    CHECK(empty.bytes.empty());

    // Laid out in the order given, back to back.
    const auto& all = f.tensors();
    CHECK(all.front().begin == 0);
    for (size_t i = 1; i < all.size(); ++i) CHECK(all[i].begin == all[i - 1].end);
    CHECK(all.back().end == 96 + 8 + 10 + 4 + 16 + 24 + 7 + 16);

    // Copies share the buffer; spans stay valid after the original is gone.
    std::optional<SafetensorsFile> original(SafetensorsFile::open(p));
    SafetensorsFile copy = *original;
    original.reset();
    std::vector<float> again(w.size());
    copy.read_f32("blocks.0.w", again, {2, 3, 4});
    CHECK(again == w);
}

TEST_CASE("safetensors: written bytes match a hand-built file", "[safetensors]") {
    TempDir tmp;
    const fs::path p = tmp.path() / "tiny.safetensors";
    const float a[2] = {1.0f, -2.0f};
    const uint8_t b[3] = {0xde, 0xad, 0x01};
    write_safetensors(p, {{"a", DType::F32, {2}, a}, {"b", DType::U8, {3}, b}}, {{"format", "pt"}});

    const std::string bytes = slurp(p);
    REQUIRE(bytes.size() >= 8);
    uint64_t n = 0;
    for (int i = 0; i < 8; ++i)
        n |= static_cast<uint64_t>(static_cast<uint8_t>(bytes[i])) << (8 * i);
    CHECK(n % 8 == 0);
    REQUIRE(bytes.size() == 8 + n + 8 + 3);

    const std::string header = bytes.substr(8, n);
    const size_t json_end = header.find_last_not_of(' ') + 1;
    CHECK(header[json_end - 1] == '}');
    // Padding: only spaces, and fewer than 8 of them.
    CHECK(n - json_end < 8);
    CHECK(header.substr(json_end) == std::string(n - json_end, ' '));
    CHECK(header.substr(0, json_end).find('\n') == std::string::npos);

    const nlohmann::json expected = {
        {"__metadata__", {{"format", "pt"}}},
        {"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
        {"b", {{"dtype", "U8"}, {"shape", {3}}, {"data_offsets", {8, 11}}}},
    };
    CHECK(nlohmann::json::parse(header.substr(0, json_end)) == expected);

    // 1.0f = 0x3f800000, -2.0f = 0xc0000000, little-endian; then the three u8 bytes.
    const std::string data = bytes.substr(8 + n);
    const std::string expected_data("\x00\x00\x80\x3f\x00\x00\x00\xc0\xde\xad\x01", 11);
    CHECK(data == expected_data);
}

TEST_CASE("safetensors: reads a hand-built file as other tools write it", "[safetensors]") {
    TempDir tmp;
    const fs::path p = tmp.path() / "hf.safetensors";
    // Header as the reference writer produces it: compact JSON, __metadata__ first, space padded;
    // a data block whose tensors are not in header order.
    std::string header =
        R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
        R"("y":{"dtype":"I64","shape":[],"data_offsets":[0,8]}})";
    header.append((8 - header.size() % 8) % 8, ' ');
    std::string data = le64(7) + f32_bytes({0.25f, 3.0f});
    put(p, image(header, data));

    SafetensorsFile f = SafetensorsFile::open(p);
    CHECK(f.names() == std::vector<std::string>{"y", "x"});
    CHECK(f.metadata() == std::map<std::string, std::string>{{"format", "pt"}});
    float x[2] = {};
    f.read_f32("x", x, {2});
    CHECK(x[0] == 0.25f);
    CHECK(x[1] == 3.0f);
    int64_t y = 0;
    f.read("y", DType::I64, {}, std::as_writable_bytes(std::span(&y, 1)));
    CHECK(y == 7);
}

TEST_CASE("safetensors: corrupt files are rejected with the file and the problem named",
          "[safetensors]") {
    TempDir tmp;
    const fs::path& d = tmp.path();
    const std::string ok_entry = R"("dtype":"F32","shape":[2],"data_offsets":[0,8])";
    const std::string data8 = f32_bytes({1.0f, 2.0f});
    auto one = [&](const std::string& entry) { return "{\"t\":{" + entry + "}}"; };

    // Sanity: the good baseline opens, so each failure below is due to its one change.
    put(d / "good.safetensors", image(one(ok_entry), data8));
    CHECK(SafetensorsFile::open(d / "good.safetensors").get("t").numel() == 2);

    expect_open_error(d / "missing.safetensors", "No such file");
    expect_corrupt(d, "empty", "", "too short");
    expect_corrupt(d, "short", std::string("\x10\x00\x00", 3), "too short");
    expect_corrupt(d, "len_past_eof", image(one(ok_entry), data8, 4096), "past the end");
    expect_corrupt(d, "len_absurd", image(one(ok_entry), data8, 200'000'000), "too large");
    expect_corrupt(d, "len_huge", image(one(ok_entry), data8, UINT64_MAX), "too large");
    expect_corrupt(d, "bad_json", image(R"({"t":{"dtype":"F32",)", data8), "not valid JSON");
    expect_corrupt(d, "bad_utf8", image("{\"t\xff\":{" + ok_entry + "}}", data8), "not valid JSON");
    expect_corrupt(d, "not_object", image("[1,2,3]", data8), "not a JSON object");
    expect_corrupt(d, "entry_not_object", image(R"({"t":[1,2]})", data8), "not a JSON object");
    expect_corrupt(d, "duplicate",
                   image("{\"t\":{" + ok_entry + "},\"t\":{" + ok_entry + "}}", data8 + data8),
                   "duplicate");
    expect_corrupt(d, "no_dtype", image(one(R"("shape":[2],"data_offsets":[0,8])"), data8),
                   "missing 'dtype'");
    expect_corrupt(d, "no_shape", image(one(R"("dtype":"F32","data_offsets":[0,8])"), data8),
                   "missing 'shape'");
    expect_corrupt(d, "no_offsets", image(one(R"("dtype":"F32","shape":[2])"), data8),
                   "missing 'data_offsets'");
    expect_corrupt(d, "dtype_type",
                   image(one(R"("dtype":4,"shape":[2],"data_offsets":[0,8])"), data8),
                   "'dtype' must be a string");
    expect_corrupt(d, "shape_type",
                   image(one(R"("dtype":"F32","shape":"2","data_offsets":[0,8])"), data8),
                   "'shape' must be an array");
    expect_corrupt(d, "shape_float",
                   image(one(R"("dtype":"F32","shape":[2.0],"data_offsets":[0,8])"), data8),
                   "'shape' must hold integers");
    expect_corrupt(d, "offsets_type",
                   image(one(R"("dtype":"F32","shape":[2],"data_offsets":{"a":0})"), data8),
                   "'data_offsets' must be an array");
    expect_corrupt(d, "offsets_three",
                   image(one(R"("dtype":"F32","shape":[2],"data_offsets":[0,4,8])"), data8),
                   "'data_offsets' must be an array");
    expect_corrupt(d, "offsets_string",
                   image(one(R"("dtype":"F32","shape":[2],"data_offsets":["0",8])"), data8),
                   "'data_offsets' must hold integers");
    expect_corrupt(d, "offsets_negative",
                   image(one(R"("dtype":"F32","shape":[2],"data_offsets":[-8,0])"), data8),
                   "negative data_offsets");
    expect_corrupt(d, "bad_dtype",
                   image(one(R"("dtype":"Q4","shape":[2],"data_offsets":[0,8])"), data8),
                   "unknown dtype 'Q4'");
    expect_corrupt(d, "neg_dim",
                   image(one(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"), data8),
                   "negative dimension");
    expect_corrupt(d, "begin_after_end",
                   image(one(R"("dtype":"F32","shape":[0],"data_offsets":[8,0])"), data8),
                   "after end");
    expect_corrupt(d, "end_out_of_range",
                   image(one(R"("dtype":"F32","shape":[4],"data_offsets":[0,16])"), data8),
                   "beyond the data block");
    expect_corrupt(d, "truncated_data", image(one(ok_entry), data8.substr(0, 5)),
                   "beyond the data block");
    expect_corrupt(d, "wrong_size",
                   image(one(R"("dtype":"F32","shape":[3],"data_offsets":[0,8])"), data8),
                   "byte size");
    expect_corrupt(
        d, "overflow",
        image(one(R"("dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8])"),
              data8),
        "overflows");
    expect_corrupt(d, "overlap",
                   image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                         data8),
                   "overlap");
    expect_corrupt(d, "overlap_nested",  // b lies wholly inside a
                   image(R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
                         R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]},)"
                         R"("c":{"dtype":"U8","shape":[2],"data_offsets":[8,10]}})",
                         data8 + "zz"),
                   "overlap");
    expect_corrupt(d, "meta_value",
                   image(R"({"__metadata__":{"step":12},"t":{)" + ok_entry + "}}", data8),
                   "metadata value for key 'step' is not a string");
    expect_corrupt(d, "meta_type", image(R"({"__metadata__":"x","t":{)" + ok_entry + "}}", data8),
                   "__metadata__ is not a JSON object");

    // Not a regular file.
    fs::create_directory(d / "dir.safetensors");
    expect_open_error(d / "dir.safetensors", "not a regular file");
}

TEST_CASE("safetensors: adjacent and empty tensors are not overlaps", "[safetensors]") {
    TempDir tmp;
    const fs::path p = tmp.path() / "edge.safetensors";
    put(p, image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("z":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                 "abcdefgh"));
    SafetensorsFile f = SafetensorsFile::open(p);
    CHECK(f.names().size() == 3);
    CHECK(std::string(reinterpret_cast<const char*>(f.get("b").bytes.data()), 4) == "efgh");
}

TEST_CASE("safetensors: get and read_f32 report missing names and mismatches", "[safetensors]") {
    TempDir tmp;
    const fs::path p = tmp.path() / "m.safetensors";
    const std::vector<float> w = {1, 2, 3, 4, 5, 6};
    const std::vector<double> dbl = {1.0, 2.0};
    write_safetensors(p, {{"w", DType::F32, {2, 3}, w.data()}, {"d", DType::F64, {2}, dbl.data()}});
    SafetensorsFile f = SafetensorsFile::open(p);
    CHECK(f.metadata().empty());

    auto message = [](auto&& fn) -> std::string {
        try {
            fn();
        } catch (const Error& e) {
            return e.what();
        }
        return "(no exception)";
    };
    std::vector<float> out(6);
    CHECK(message([&] { (void)f.get("nope"); }) ==
          "tensor 'nope' not found in '" + p.string() + "'");
    CHECK(message([&] { f.read_f32("nope", out, {6}); }) ==
          "tensor 'nope' not found in '" + p.string() + "'");
    CHECK(message([&] {
              f.read_f32("w", out, {3, 2});
          }) == "tensor 'w' in '" + p.string() + "' has shape [2,3], expected [3,2]");
    CHECK(message([&] { f.read_f32("w", out, {6}); }) ==
          "tensor 'w' in '" + p.string() + "' has shape [2,3], expected [6]");
    std::vector<float> two(2);
    CHECK(message([&] { f.read_f32("d", two, {2}); }) ==
          "tensor 'd' in '" + p.string() + "' has dtype F64, expected F32");
    std::string small_buf = message([&] { f.read_f32("w", std::span(out).first(5), {2, 3}); });
    CHECK(small_buf.find(p.string()) != std::string::npos);
    CHECK(small_buf.find("output buffer") != std::string::npos);

    // Nothing was copied by the failed reads; the good one copies.
    CHECK(out == std::vector<float>(6, 0.0f));
    f.read_f32("w", out, {2, 3});
    CHECK(out == w);
}

TEST_CASE("safetensors: invalid tensors are refused before anything is written", "[safetensors]") {
    TempDir tmp;
    const fs::path p = tmp.path() / "out.safetensors";
    put(p, "old contents");
    const float x[2] = {1, 2};
    auto refused = [&](const std::vector<TensorRef>& tensors, const std::string& word) {
        INFO(word);
        try {
            write_safetensors(p, tensors);
            FAIL_CHECK("no exception");
        } catch (const Error& e) {
            CHECK(std::string(e.what()).find(p.string()) != std::string::npos);
            CHECK(std::string(e.what()).find(word) != std::string::npos);
        }
        CHECK(slurp(p) == "old contents");
        CHECK(dir_names(tmp.path()) == std::vector<std::string>{"out.safetensors"});
    };
    refused({{"a", DType::F32, {2}, x}, {"a", DType::F32, {2}, x}}, "duplicate");
    refused({{"", DType::F32, {2}, x}}, "empty name");
    refused({{"__metadata__", DType::F32, {2}, x}}, "reserved");
    refused({{"a", DType::F32, {-2}, x}}, "negative dimension");
    refused({{"a", DType::F32, {2}, nullptr}}, "no data");
    refused({{"a", DType::F64, {INT64_MAX, 4}, x}}, "overflows");
}
