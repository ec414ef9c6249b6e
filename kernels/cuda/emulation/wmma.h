// nvcuda::wmma for the emulator: 16 x 16 x 16 fragments, bf16 operands with fp32 accumulators (the
// only shape and types the backend uses). A fragment spreads its 256 elements over the warp as a
// device does, 8 per lane: element e of the row-major 16 x 16 tile lives in lane e % 32, slot
// e / 32. Loads and stores are warp collectives: the warp meets at a barrier, then each lane moves
// its own 8 elements, so a missing __syncwarp between a store and another lane's read still shows
// as a race. mma_sync exchanges the operands through the warp and each lane computes its 8
// results, summing the exact bf16 products in fp32 in k order.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/emulation/device.h"

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
    static_assert(M == 16 && N == 16 && K == 16, "the emulator has 16 x 16 x 16 fragments only");
    static constexpr int num_elements = 8;
    T x[num_elements];
};

namespace detail {

inline constexpr unsigned kFullMask = 0xffffffffu;

// (row, column) of slot i of this lane's part of a 16 x 16 tile.
inline int row_of(int i) { return (::starling::cuda::emulation::lane_index() + 32 * i) / 16; }
inline int col_of(int i) { return (::starling::cuda::emulation::lane_index() + 32 * i) % 16; }

inline size_t offset(int r, int c, unsigned ldm, bool row_major_memory) {
    return row_major_memory ? size_t(r) * ldm + c : size_t(c) * ldm + r;
}

// As a device requires: a 256-bit aligned pointer and a row stride of a multiple of 16 bytes.
template <typename T>
void check_tile(const T* p, unsigned ldm, const char* what, std::source_location where) {
    if (reinterpret_cast<uintptr_t>(p) % 32 != 0) {
        ::starling::cuda::emulation::fault(std::string(what) + ": pointer not 32-byte aligned",
                                           where);
    }
    if (ldm * sizeof(T) % 16 != 0 || ldm < 16) {
        ::starling::cuda::emulation::fault(
            std::string(what) + ": ldm " + std::to_string(ldm) +
                " is not a multiple of 16 bytes of at least 16 elements",
            where);
    }
}

template <typename T, typename Frag>
void load(Frag& f, const T* p, unsigned ldm, bool row_major_memory, std::source_location where) {
    ::starling::cuda::emulation::warp_barrier(kFullMask, "wmma::load_matrix_sync", where);
    check_tile(p, ldm, "wmma::load_matrix_sync", where);
    for (int i = 0; i < Frag::num_elements; i++) {
        f.x[i] = p[offset(row_of(i), col_of(i), ldm, row_major_memory)];
    }
}

}  // namespace detail

template <typename Use, typename T, typename Layout>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm,
                      std::source_location where = std::source_location::current()) {
    // For matrix_b, element (k, n) of a row-major tile is at k * ldm + n: the same rule as A's.
    detail::load(f, p, ldm, std::is_same_v<Layout, row_major>, where);
}

inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout,
                             std::source_location where = std::source_location::current()) {
    detail::load(f, p, ldm, layout == mem_row_major, where);
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout,
                              std::source_location where = std::source_location::current()) {
    ::starling::cuda::emulation::warp_barrier(detail::kFullMask, "wmma::store_matrix_sync", where);
    detail::check_tile(p, ldm, "wmma::store_matrix_sync", where);
    for (int i = 0; i < 8; i++) {
        p[detail::offset(detail::row_of(i), detail::col_of(i), ldm, layout == mem_row_major)] =
            f.x[i];
    }
}

template <typename Use, typename T, typename Layout>
void fill_fragment(fragment<Use, 16, 16, 16, T, Layout>& f, float value) {
    for (int i = 0; i < fragment<Use, 16, 16, 16, T, Layout>::num_elements; i++) f.x[i] = T(value);
}

template <typename LayoutA, typename LayoutB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LayoutA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LayoutB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c,
              std::source_location where = std::source_location::current()) {
    struct Operands {
        __nv_bfloat16 a[8], b[8];
    };
    Operands mine;
    for (int i = 0; i < 8; i++) {
        mine.a[i] = a.x[i];
        mine.b[i] = b.x[i];
    }
    const Operands* all =
        ::starling::cuda::emulation::exchange(detail::kFullMask, mine, "wmma::mma_sync", where);
    // Element (r, c) of a tile is in lane (16 r + c) % 32, slot (16 r + c) / 32.
    auto a_at = [&](int r, int k) { return float(all[(16 * r + k) % 32].a[(16 * r + k) / 32]); };
    auto b_at = [&](int k, int n) { return float(all[(16 * k + n) % 32].b[(16 * k + n) / 32]); };
    for (int i = 0; i < 8; i++) {
        const int r = detail::row_of(i), n = detail::col_of(i);
        float acc = c.x[i];
        for (int k = 0; k < 16; k++) acc += a_at(r, k) * b_at(k, n);
        d.x[i] = acc;
    }
}

}  // namespace nvcuda::wmma
