// CUDA element codecs: the Q8 / Q4 / BF16SR codecs of optimizer/codec/codec.h on the device, bit
// for bit the bytes the CPU writes (same layout, same per-element arithmetic from kernels/math.h,
// same Philox bits from kernels/rounding.h). See optimizer/codec/README.md, "Element
// codecs".
//
// All data pointers are device pointers. Every call is enqueued on `stream`; the ones that can
// report an error in the data (encode_q8_delta, decode_q) wait for the stream to find out and then
// throw starling::Error like the CPU codec. Failing CUDA calls throw starling::Error naming the
// call and cudaGetErrorString.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace starling::cuda {

// Number of usable CUDA devices; 0 (never throws) when cudaGetDeviceCount fails, as it does on a
// machine without a driver. If reason is given it receives cudaGetErrorString of the failure (or
// "no CUDA device" when the call succeeds with none).
int cuda_device_count(std::string* reason = nullptr);

// One fused pass over n elements: x = theta - phi (+ residual), cut into blocks of 64 (the last may
// be short); each block is encoded with qmax 127 (Q8, 68 bytes per whole block) or 7 (Q4, 36 bytes,
// low nibble first) exactly as codec::encode (residual == nullptr) or codec::encode_with_feedback
// (delta = theta - phi) on the CPU with RoundingKey{node_id, round, stream_id}, and, with a
// residual, leaves residual = x - q * s. out holds codec::encoded_bytes(Q8 or Q4, n) bytes.
// first_index must be a multiple of 64. A block whose x holds a NaN or Inf is not written (nor its
// residual); the call then throws starling::Error naming the first such block, and the output must
// be discarded, as on the CPU.
void encode_q8_delta(std::byte* out, float* residual, const float* theta, const float* phi,
                     size_t n, uint64_t first_index, uint64_t node_id, uint64_t round,
                     uint32_t stream_id, int qmax, cudaStream_t stream = 0);

// Decodes n values of Q8 (qmax 127) or Q4 (qmax 7) data, encoded_bytes(codec, n) bytes. Every block
// is validated on the device as codec::decode does (a NaN, Inf or negative scale, the level -128
// or -8, a non-zero Q4 padding nibble); a bad block is not written, and the call throws
// starling::Error naming the first bad block and its problem (other blocks may have been decoded,
// so the output must be discarded).
void decode_q(float* out, const std::byte* in, size_t n, int qmax, cudaStream_t stream = 0);

// BF16 by stochastic rounding, as codec::encode(Codec::BF16SR, ...): out[i] is the high half of the
// rounded fp32 bits of x[i], whose global index is first_index + i (any value). Never fails on
// data.
void encode_bf16sr(uint16_t* out, const float* x, size_t n, uint64_t first_index, uint64_t node_id,
                   uint64_t round, uint32_t stream_id, cudaStream_t stream = 0);

// out[i] = the fp32 whose high half is in[i] (low half zero).
void decode_bf16(float* out, const uint16_t* in, size_t n, cudaStream_t stream = 0);

}  // namespace starling::cuda
