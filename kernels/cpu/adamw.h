// AdamW over flat parameter arenas; the per-element update is shared with the CUDA backend.
#pragma once

#include <cstddef>

#include "kernels/math.h"

namespace starling::cpu {

// params (n), m (n), v (n) updated in place from grads (n)
template <typename T>
void adamw_update(T* params, T* m, T* v, const T* grads, size_t n, const AdamWScalars& s) {
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        adamw_element(params[i], m[i], v[i], grads[i], s);
    }
}

}  // namespace starling::cpu
