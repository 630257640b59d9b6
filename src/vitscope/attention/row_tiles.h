// Rows of float32 or bfloat16 elements as float vectors for the sparse normalisers: chunks of 16 (masked at a
// row's end) loaded and stored, bfloat16 rounded as PyTorch rounds it, and 16 rows loaded into one transposed
// tile buffer (one row per vector lane) with a 16 x 16 in-register transpose and per-lane row statistics.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "vector_math.h"

namespace vitscope {

// Input element types: float32, or bfloat16 (the high half of a float32)
enum DType { F32 = 0, BF16 = 1 };

inline float to_float(float v) { return v; }
inline float to_float(uint16_t v) {
    const uint32_t bits = uint32_t(v) << 16;
    float f;
    std::memcpy(&f, &bits, sizeof f);
    return f;
}

// 16 consecutive elements as a float vector
inline vf load16(const float *p) {
    vf v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline vi load16i(const int32_t *p) {
    vi v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline vf load16(const uint16_t *p) {
    typedef uint16_t vh __attribute__((vector_size(2 * L)));
    typedef uint32_t vu __attribute__((vector_size(4 * L)));
    vh h;
    std::memcpy(&h, p, sizeof h);
    return (vf)(__builtin_convertvector(h, vu) << 16);
}

// The first `width` (< L) elements at p as a float vector, `fill` in the other lanes; and the first `width` lanes
// of v stored to p. Masked loads and stores with AVX-512 (AVX512BW for bfloat16), element loops elsewhere.
#if defined(__AVX512F__)
inline vf load_part(const float *p, int width, float fill) {
    return (vf)_mm512_mask_loadu_ps(_mm512_set1_ps(fill), __mmask16((1u << width) - 1), p);
}
inline void store_part(float *p, int width, vf v) {
    _mm512_mask_storeu_ps(p, __mmask16((1u << width) - 1), (__m512)v);
}
#else
inline vf load_part(const float *p, int width, float fill) {
    vf v = splat(fill);
    for (int l = 0; l < width; ++l) v[l] = p[l];
    return v;
}
inline void store_part(float *p, int width, vf v) {
    for (int l = 0; l < width; ++l) p[l] = v[l];
}
#endif
#if defined(__AVX512BW__) && defined(__AVX512VL__)
inline vf load_part(const uint16_t *p, int width, float fill) {
    const __mmask16 k = __mmask16((1u << width) - 1);
    const __m512i bits = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, p)), 16);
    return (vf)_mm512_mask_blend_ps(k, _mm512_set1_ps(fill), _mm512_castsi512_ps(bits));
}
#else
inline vf load_part(const uint16_t *p, int width, float fill) {
    vf v = splat(fill);
    for (int l = 0; l < width; ++l) v[l] = to_float(p[l]);
    return v;
}
#endif

// Float vectors as bfloat16, rounded to nearest even as PyTorch does it (NaN stays a quiet NaN), and stored
typedef uint16_t vh __attribute__((vector_size(2 * L)));
inline vh to_bf16_rounded(vf v) {
    typedef uint32_t vu __attribute__((vector_size(4 * L)));
    const vu bits = (vu)v;
    const vu rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
    return __builtin_convertvector((v != v) ? ((bits >> 16) | 0x40u) : rounded, vh);
}
// With AVX512_BF16, one vcvtneps2bf16: the same rounding and the same quiet NaN, but it reads float32 subnormals as
// zero, so a vector holding one (rare: probabilities below 1.2e-38) takes the arithmetic above instead.
inline vh to_bf16(vf v) {
#if defined(__AVX512BF16__)
    const __m512 a = (__m512)v;
    const __mmask16 subnormal = _mm512_mask_cmp_ps_mask(
        _mm512_cmp_ps_mask(a, _mm512_setzero_ps(), _CMP_NEQ_UQ),
        _mm512_abs_ps(a), _mm512_set1_ps(1.17549435e-38f), _CMP_LT_OQ);
    if (__builtin_expect(subnormal != 0, 0)) return to_bf16_rounded(v);
    return (vh)_mm512_cvtneps_pbh(a);
#else
    return to_bf16_rounded(v);
#endif
}
inline void store16(float *p, vf v) { std::memcpy(p, &v, sizeof v); }
inline void store16(uint16_t *p, vf v) {
    const vh h = to_bf16(v);
    std::memcpy(p, &h, sizeof h);
}
inline void store_part(uint16_t *p, int width, vf v) {
    const vh h = to_bf16(v);
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    _mm256_mask_storeu_epi16(p, __mmask16((1u << width) - 1), (__m256i)h);
#else
    for (int l = 0; l < width; ++l) p[l] = h[l];
#endif
}

// Elements [i, i + L) of a row of n as a float vector, `fill` past its end; and the store of such a chunk
template <typename T>
inline vf load_chunk(const T *row, int64_t i, int64_t n, float fill) {
    return i + L <= n ? load16(row + i) : load_part(row + i, int(n - i), fill);
}

template <typename T>
inline void store_chunk(T *row, int64_t i, int64_t n, vf v) {
    if (i + L <= n) store16(row + i, v);
    else store_part(row + i, int(n - i), v);
}

// One stage of a 16 x 16 transpose: swap the off-diagonal h x h blocks of every 2h x 2h block.
#define STAGE(h, ...) \
    for (int i = 0; i < L; ++i) if (!(i & h)) { \
        vf a = t[i], b = t[i + h]; \
        t[i] = __builtin_shufflevector(a, b, __VA_ARGS__); \
        t[i + h] = __builtin_shufflevector(a, b, STAGE_HI_##h); \
    }
#define STAGE_HI_8 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31
#define STAGE_HI_4 4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31
#define STAGE_HI_2 2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31
#define STAGE_HI_1 1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31

inline void transpose16(vf *t) {
    STAGE(8, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
    STAGE(4, 0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
    STAGE(2, 0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
    STAGE(1, 0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
}

// The rows of one block into buf (n x 16) as z = scale * (x - max), shifted before scaling so that a large
// common offset loses no digits. Per lane: the maximum of x, the sum and count of the finite z (masked keys, -inf,
// left out, so a masked row starts from the same bound as the same row without its masked keys), and whether the
// row can be solved at all (no NaN, no +inf, something above -inf).
struct BlockStats {
    vf max, sum, count;
    vi live;
};

template <typename T>
BlockStats load_block(const T *x, int rows, int64_t n, vf scale, vf *buf) {
    const T *row[L];
    for (int l = 0; l < L; ++l) row[l] = x + (l < rows ? l : 0) * n;  // idle lanes repeat row 0
    const vf inf = splat(INFINITY);
    vf max = -inf;
    int64_t i0 = 0;
    for (; i0 + L <= n; i0 += L) {
        vf t[L];
        for (int l = 0; l < L; ++l) {
            t[l] = load16(row[l] + i0);
            __builtin_prefetch(row[l] + i0 + L * n, 0, 1);  // the same tile of the next block
        }
        transpose16(t);
        for (int c = 0; c < L; ++c) {
            buf[i0 + c] = t[c];
            max = t[c] > max ? t[c] : max;
        }
    }
    for (int64_t i = i0; i < n; ++i) {
        vf v;
        for (int l = 0; l < L; ++l) v[l] = to_float(row[l][i]);
        buf[i] = v;
        max = v > max ? v : max;
    }
    vf sum{}, count{};
    vi nan{};
    for (int64_t i = 0; i < n; ++i) {  // still in cache
        const vf z = scale * (buf[i] - max);
        const vi finite = (z > -inf);
        buf[i] = z;
        sum += finite ? z : vf{};
        count += finite ? splat(1.0f) : vf{};
        nan |= z != z;
    }
    vi live = ~nan & (max > -inf) & (max < inf);
    for (int l = rows; l < L; ++l) live[l] = 0;
    return {max, sum, count, live};
}

}  // namespace vitscope
