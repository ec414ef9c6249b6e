// The Hugging Face safetensors format: an 8-byte little-endian header length N, N bytes of JSON
// header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}} padded with spaces to a multiple of 8, then the data block
// (offsets are relative to its start). Tensor data is stored little-endian, row-major.
//
// Reading treats the file as hostile: every structural problem throws starling::Error whose
// message names the file and the problem.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace starling {

enum class DType { F32, F64, BF16, F16, I32, I64, U8, U64 };

size_t dtype_size(DType dtype);                               // bytes per element
std::string_view dtype_name(DType dtype);                     // "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view name);  // nullopt if unknown

// Header length limit on read (the reference implementation's limit).
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100'000'000;

// One tensor to write. data points at product(shape) * dtype_size(dtype) bytes in host memory
// (shape {} is a scalar: one element); it may be null only when that size is zero.
struct TensorRef {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
};

// Writes the tensors, laid out in the order given, and the metadata ("__metadata__", omitted when
// empty) atomically: the bytes stream to a temporary file that is fsynced and renamed over path,
// so no copy of the payload is made. Throws starling::Error (target untouched) for an empty,
// duplicate or reserved ("__metadata__") name, a negative dimension, a size overflow, a null
// data pointer for a non-empty tensor, or any I/O failure.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorRef>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A tensor of an opened file; bytes points into the file's buffer and stays valid as long as any
// copy of the SafetensorsFile it came from lives.
struct TensorEntry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::span<const std::byte> bytes;  // not necessarily aligned for the element type
    uint64_t begin = 0;                // offsets into the data block
    uint64_t end = 0;

    int64_t numel() const;
};

// "[2,3]"; "[]" for a scalar.
std::string shape_string(const std::vector<int64_t>& shape);

class SafetensorsFile {
public:
    // Reads the whole file into memory and validates it.
    static SafetensorsFile open(const std::filesystem::path& path);
    // Validates an in-memory image; source names it in error messages.
    static SafetensorsFile parse(std::vector<std::byte> contents,
                                 const std::filesystem::path& source);

    const std::filesystem::path& path() const { return path_; }
    bool has(std::string_view name) const;
    const TensorEntry& get(std::string_view name) const;  // throws "tensor X not found in FILE"
    std::vector<std::string> names() const;               // in data-offset order
    const std::vector<TensorEntry>& tensors() const { return entries_; }  // data-offset order
    const std::map<std::string, std::string>& metadata() const { return metadata_; }

    // Checks dtype, shape and out.size() against the tensor, then copies its bytes into out.
    void read(std::string_view name, DType dtype, const std::vector<int64_t>& expected_shape,
              std::span<std::byte> out) const;
    void read_f32(std::string_view name, std::span<float> out,
                  const std::vector<int64_t>& expected_shape) const;

private:
    std::filesystem::path path_;
    std::shared_ptr<const std::vector<std::byte>> buffer_;
    std::vector<TensorEntry> entries_;
    std::map<std::string, size_t, std::less<>> index_;
    std::map<std::string, std::string> metadata_;
};

}  // namespace starling
