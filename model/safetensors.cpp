#include "model/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/atomic_file.h"

namespace starling {

// Tensor bytes are copied to and from host memory as they are; the format is little-endian.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

struct DTypeInfo {
    DType dtype;
    std::string_view name;
    size_t size;
};

constexpr std::array<DTypeInfo, 8> kDTypes = {{
    {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},
    {DType::BF16, "BF16", 2},
    {DType::F16, "F16", 2},
    {DType::I32, "I32", 4},
    {DType::I64, "I64", 8},
    {DType::U8, "U8", 1},
    {DType::U64, "U64", 8},
}};

const DTypeInfo& info(DType dtype) {
    for (const auto& i : kDTypes) {
        if (i.dtype == dtype) return i;
    }
    throw Error("invalid DType value " + std::to_string(static_cast<int>(dtype)));
}

constexpr std::string_view kMetadataKey = "__metadata__";

// product(shape) * element_size, or nullopt on a negative dimension or uint64 overflow.
std::optional<uint64_t> checked_byte_size(const std::vector<int64_t>& shape, size_t element_size) {
    uint64_t n = element_size;
    for (int64_t d : shape) {
        if (d < 0) return std::nullopt;
        if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
    }
    return n;
}

std::string quoted(const std::filesystem::path& p) {
    std::string s = "'";  // built up with += : GCC 12 warns falsely (-Wrestrict) on "'" + string&&
    s += p.string();
    s += "'";
    return s;
}

}  // namespace

size_t dtype_size(DType dtype) { return info(dtype).size; }

std::string_view dtype_name(DType dtype) { return info(dtype).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
    for (const auto& i : kDTypes) {
        if (i.name == name) return i.dtype;
    }
    return std::nullopt;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ",";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

int64_t TensorEntry::numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;  // cannot overflow: validated when the file was opened
    return n;
}

// ---------------------------------------------------------------------------------------------
// Writing

void write_safetensors(const std::filesystem::path& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata) {
    auto bad = [&](const std::string& msg) {
        return Error("cannot write safetensors file " + quoted(path) + ": " + msg);
    };

    nlohmann::ordered_json header = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
        auto& m = header[std::string(kMetadataKey)];
        m = nlohmann::ordered_json::object();
        for (const auto& [k, v] : metadata) m[k] = v;
    }

    std::vector<uint64_t> sizes;
    sizes.reserve(tensors.size());
    std::set<std::string_view> seen;
    uint64_t offset = 0;
    for (const TensorRef& t : tensors) {
        if (t.name.empty()) throw bad("tensor with an empty name");
        if (t.name == kMetadataKey) throw bad("tensor name '__metadata__' is reserved");
        if (!seen.insert(t.name).second) throw bad("duplicate tensor name '" + t.name + "'");
        for (int64_t d : t.shape) {
            if (d < 0) {
                throw bad("tensor '" + t.name + "' has negative dimension " + std::to_string(d) +
                          " in shape " + shape_string(t.shape));
            }
        }
        std::optional<uint64_t> size = checked_byte_size(t.shape, dtype_size(t.dtype));
        uint64_t end = 0;
        if (!size || __builtin_add_overflow(offset, *size, &end)) {
            throw bad("tensor '" + t.name + "' of shape " + shape_string(t.shape) +
                      " overflows the byte size");
        }
        if (*size > 0 && t.data == nullptr) throw bad("tensor '" + t.name + "' has no data");
        header[t.name] = nlohmann::ordered_json{
            {"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
        sizes.push_back(*size);
        offset = end;
    }

    std::string text;
    try {
        text = header.dump();
    } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not valid UTF-8
        throw bad(std::string("cannot encode the header: ") + e.what());
    }
    // Pad with spaces so the data block starts 8-byte aligned, as the reference implementation
    // does.
    text.append((8 - text.size() % 8) % 8, ' ');

    std::array<std::byte, 8> length{};
    for (size_t i = 0; i < 8; ++i) {
        length[i] = static_cast<std::byte>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xff);
    }

    AtomicFileWriter out(path);
    out.write(length);
    out.write(text);
    for (size_t i = 0; i < tensors.size(); ++i) {
        out.write({static_cast<const std::byte*>(tensors[i].data), static_cast<size_t>(sizes[i])});
    }
    out.commit();
}

// ---------------------------------------------------------------------------------------------
// Reading

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
    std::vector<std::byte> contents;
    try {
        contents = read_file_bytes(path);
    } catch (const Error& e) {
        throw Error(std::string("cannot open safetensors file: ") + e.what());
    }
    return parse(std::move(contents), path);
}

SafetensorsFile SafetensorsFile::parse(std::vector<std::byte> contents,
                                       const std::filesystem::path& source) {
    auto bad = [&](const std::string& msg) {
        return Error("invalid safetensors file " + quoted(source) + ": " + msg);
    };

    SafetensorsFile file;
    file.path_ = source;
    auto buffer = std::make_shared<const std::vector<std::byte>>(std::move(contents));
    file.buffer_ = buffer;
    const std::vector<std::byte>& bytes = *buffer;

    if (bytes.size() < 8) {
        throw bad("file is too short (" + std::to_string(bytes.size()) +
                  " bytes) to hold the 8-byte header length");
    }
    uint64_t header_len = 0;
    for (size_t i = 0; i < 8; ++i) header_len |= static_cast<uint64_t>(bytes[i]) << (8 * i);
    if (header_len > kSafetensorsMaxHeaderBytes) {
        throw bad("header length " + std::to_string(header_len) + " is too large (limit " +
                  std::to_string(kSafetensorsMaxHeaderBytes) + " bytes)");
    }
    if (header_len > bytes.size() - 8) {
        throw bad("header length " + std::to_string(header_len) +
                  " runs past the end of the file (" + std::to_string(bytes.size()) + " bytes)");
    }
    const char* header_begin = reinterpret_cast<const char*>(bytes.data()) + 8;
    const uint64_t data_start = 8 + header_len;
    const uint64_t data_size = bytes.size() - data_start;

    // Parse, noting duplicate keys in any object (nlohmann would keep only the last one).
    std::vector<std::set<std::string>> open_objects;
    std::string duplicate;
    auto callback = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using E = nlohmann::json::parse_event_t;
        if (event == E::object_start) {
            open_objects.emplace_back();
        } else if (event == E::object_end) {
            if (!open_objects.empty()) open_objects.pop_back();
        } else if (event == E::key && !open_objects.empty() && duplicate.empty() &&
                   parsed.is_string()) {
            if (!open_objects.back().insert(parsed.get<std::string>()).second) {
                duplicate = parsed.get<std::string>();
            }
        }
        return true;
    };
    nlohmann::json header;
    try {
        header = nlohmann::json::parse(header_begin, header_begin + header_len, callback);
    } catch (const nlohmann::json::exception& e) {
        throw bad(std::string("header is not valid JSON: ") + e.what());
    }
    if (!header.is_object()) throw bad("header is not a JSON object");
    if (!duplicate.empty()) throw bad("duplicate key '" + duplicate + "' in the JSON header");

    for (const auto& [key, value] : header.items()) {
        if (key == kMetadataKey) {
            if (value.is_null()) continue;
            if (!value.is_object()) throw bad("__metadata__ is not a JSON object");
            for (const auto& [mk, mv] : value.items()) {
                if (!mv.is_string()) {
                    throw bad("metadata value for key '" + mk + "' is not a string");
                }
                file.metadata_[mk] = mv.get<std::string>();
            }
            continue;
        }

        const std::string what = "tensor '" + key + "'";
        if (!value.is_object()) throw bad(what + ": entry is not a JSON object");
        // A named reference, not the binding: clang 14 cannot capture structured bindings.
        const nlohmann::json& fields = value;
        auto field = [&](const char* name) -> const nlohmann::json& {
            auto it = fields.find(name);
            if (it == fields.end()) throw bad(what + " is missing '" + name + "'");
            return *it;
        };
        // A JSON integer as int64 (negative allowed) or uint64; anything else is a type error.
        auto integer = [&](const nlohmann::json& v,
                           const char* field_name) -> std::pair<bool, uint64_t> {
            if (v.is_number_unsigned()) return {false, v.get<uint64_t>()};
            if (v.is_number_integer()) {
                int64_t s = v.get<int64_t>();
                if (s < 0) return {true, static_cast<uint64_t>(-(s + 1)) + 1};
                return {false, static_cast<uint64_t>(s)};
            }
            throw bad(what + ": '" + field_name + "' must hold integers, got " + v.dump());
        };

        TensorEntry entry;
        entry.name = key;

        const nlohmann::json& dtype = field("dtype");
        if (!dtype.is_string()) throw bad(what + ": 'dtype' must be a string, got " + dtype.dump());
        std::optional<DType> dt = dtype_from_name(dtype.get<std::string>());
        if (!dt) throw bad(what + " has unknown dtype '" + dtype.get<std::string>() + "'");
        entry.dtype = *dt;

        const nlohmann::json& shape = field("shape");
        if (!shape.is_array()) throw bad(what + ": 'shape' must be an array, got " + shape.dump());
        for (const auto& d : shape) {
            auto [negative, magnitude] = integer(d, "shape");
            if (negative) {
                throw bad(what + " has negative dimension " + d.dump() + " in shape " +
                          shape.dump());
            }
            if (magnitude > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
                throw bad(what + " has dimension " + d.dump() + " too large in shape " +
                          shape.dump());
            }
            entry.shape.push_back(static_cast<int64_t>(magnitude));
        }

        const nlohmann::json& offsets = field("data_offsets");
        if (!offsets.is_array() || offsets.size() != 2) {
            throw bad(what + ": 'data_offsets' must be an array [begin, end], got " +
                      offsets.dump());
        }
        auto [begin_negative, begin] = integer(offsets[0], "data_offsets");
        auto [end_negative, end] = integer(offsets[1], "data_offsets");
        if (begin_negative || end_negative) {
            throw bad(what + " has negative data_offsets " + offsets.dump());
        }
        if (begin > end) {
            throw bad(what + " has data_offsets begin " + std::to_string(begin) + " after end " +
                      std::to_string(end));
        }
        if (end > data_size) {
            throw bad(what + " has data_offsets end " + std::to_string(end) +
                      " beyond the data block (" + std::to_string(data_size) + " bytes)");
        }
        std::optional<uint64_t> expected = checked_byte_size(entry.shape, dtype_size(entry.dtype));
        if (!expected) {
            throw bad(what + ": shape " + shape_string(entry.shape) + " overflows the byte size");
        }
        if (end - begin != *expected) {
            throw bad(what + " has byte size " + std::to_string(end - begin) + " but shape " +
                      shape_string(entry.shape) + " of " + std::string(dtype_name(entry.dtype)) +
                      " needs " + std::to_string(*expected) + " bytes");
        }
        entry.begin = begin;
        entry.end = end;
        entry.bytes = std::span<const std::byte>(bytes.data() + data_start + begin, end - begin);
        file.entries_.push_back(std::move(entry));
    }

    std::sort(file.entries_.begin(), file.entries_.end(),
              [](const TensorEntry& a, const TensorEntry& b) {
                  return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
              });
    // Sorted by begin, non-empty ranges are disjoint iff each starts at or after the furthest end
    // seen so far. Empty tensors occupy no bytes and overlap nothing.
    const TensorEntry* furthest = nullptr;
    for (const TensorEntry& e : file.entries_) {
        if (e.begin == e.end) continue;
        if (furthest && e.begin < furthest->end) {
            throw bad("tensors '" + furthest->name + "' and '" + e.name + "' overlap (bytes [" +
                      std::to_string(furthest->begin) + "," + std::to_string(furthest->end) +
                      ") and [" + std::to_string(e.begin) + "," + std::to_string(e.end) + "))");
        }
        if (!furthest || e.end > furthest->end) furthest = &e;
    }
    for (size_t i = 0; i < file.entries_.size(); ++i) file.index_.emplace(file.entries_[i].name, i);
    return file;
}

bool SafetensorsFile::has(std::string_view name) const { return index_.find(name) != index_.end(); }

const TensorEntry& SafetensorsFile::get(std::string_view name) const {
    auto it = index_.find(name);
    if (it == index_.end()) {
        throw Error("tensor '" + std::string(name) + "' not found in " + quoted(path_));
    }
    return entries_[it->second];
}

std::vector<std::string> SafetensorsFile::names() const {
    std::vector<std::string> out;
    out.reserve(entries_.size());
    for (const auto& e : entries_) out.push_back(e.name);
    return out;
}

void SafetensorsFile::read(std::string_view name, DType dtype,
                           const std::vector<int64_t>& expected_shape,
                           std::span<std::byte> out) const {
    const TensorEntry& e = get(name);
    const std::string what = "tensor '" + e.name + "' in " + quoted(path_);
    if (e.dtype != dtype) {
        throw Error(what + " has dtype " + std::string(dtype_name(e.dtype)) + ", expected " +
                    std::string(dtype_name(dtype)));
    }
    if (e.shape != expected_shape) {
        throw Error(what + " has shape " + shape_string(e.shape) + ", expected " +
                    shape_string(expected_shape));
    }
    if (out.size() != e.bytes.size()) {
        throw Error(what + " has " + std::to_string(e.bytes.size()) +
                    " bytes but the output buffer holds " + std::to_string(out.size()));
    }
    if (!out.empty()) std::memcpy(out.data(), e.bytes.data(), out.size());
}

void SafetensorsFile::read_f32(std::string_view name, std::span<float> out,
                               const std::vector<int64_t>& expected_shape) const {
    read(name, DType::F32, expected_shape, std::as_writable_bytes(out));
}

}  // namespace starling
