// Rotary position embedding in the Hugging Face Llama "rotate_half" layout (element j of a head
// pairs with j + hs/2), so checkpoints load in Hugging Face without permuting q and k weights.
#pragma once

#include <cmath>
#include <cstddef>
#include <vector>

#include "kernels/math.h"

namespace starling::cpu {

// qkv (B,T,3C) rotated in place on its q and k thirds; direction +1 rotates, -1 undoes it
template <typename T>
void rope_rotate_qk(T* qkv, int B, int T_, int C, int NH, float theta, int direction) {
    int hs = C / NH;
    int half = hs / 2;
    // Angles in double, then rounded once, so float and double runs see the same rotation.
    std::vector<T> cos_t(size_t(T_) * half);
    std::vector<T> sin_t(size_t(T_) * half);
    for (int t = 0; t < T_; t++) {
        for (int j = 0; j < half; j++) {
            double angle = double(t) * rope_inv_freq(j, hs, theta);
            cos_t[size_t(t) * half + j] = T(std::cos(angle));
            sin_t[size_t(t) * half + j] = T(direction * std::sin(angle));
        }
    }
#pragma omp parallel for schedule(static)
    for (int row = 0; row < B * T_; row++) {
        int t = row % T_;
        const T* cs = cos_t.data() + size_t(t) * half;
        const T* sn = sin_t.data() + size_t(t) * half;
        T* qk = qkv + size_t(row) * 3 * C;
        // The 2*NH heads of q and k sit side by side in the first 2C columns.
        for (int h = 0; h < 2 * NH; h++) {
            T* x = qk + size_t(h) * hs;
#pragma omp simd
            for (int j = 0; j < half; j++) {
                rope_rotate(x[j], x[j + half], cs[j], sn[j]);
            }
        }
    }
}

// qkv (B,T,3C)
template <typename T>
void rope_forward(T* qkv, int B, int T_, int C, int NH, float theta) {
    rope_rotate_qk(qkv, B, T_, C, NH, theta, +1);
}

// dqkv (B,T,3C): a rotation's gradient is the inverse rotation
template <typename T>
void rope_backward(T* dqkv, int B, int T_, int C, int NH, float theta) {
    rope_rotate_qk(dqkv, B, T_, C, NH, theta, -1);
}

}  // namespace starling::cpu
