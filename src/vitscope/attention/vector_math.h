// 16-lane float vectors (GCC/Clang vector extensions: AVX-512, AVX2 or NEON, whatever -march gives) and the
// few functions the sparse normalisers need on them: sqrt, exp/log/pow accurate to a few float32 ulps (Cephes'
// single-precision polynomials; log2/exp2 from AVX-512's exponent instructions where there are some) for
// alpha-entmax, and the compaction of selected lanes.
#pragma once

#include <cmath>
#include <cstdint>
#if defined(__AVX512F__) || defined(__BMI2__)
#include <immintrin.h>
#endif

namespace vitscope {

constexpr int L = 16;  // vector lanes
typedef float vf __attribute__((vector_size(4 * L)));
typedef int32_t vi __attribute__((vector_size(4 * L)));

inline vf splat(float v) { return vf{} + v; }

// Horizontal sum and maximum of the 16 lanes, as a tree (a chain of 16 would be latency-bound)
inline float hsum(vf v) {
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v4 __attribute__((vector_size(16)));
    const v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                 __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
    return (b[0] + b[2]) + (b[1] + b[3]);
}

inline float hmax(vf v) {
    typedef float v8 __attribute__((vector_size(32)));
    typedef float v4 __attribute__((vector_size(16)));
    const v8 lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    const v8 hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
    const v8 a = lo > hi ? lo : hi;
    const v4 c = __builtin_shufflevector(a, a, 0, 1, 2, 3), d = __builtin_shufflevector(a, a, 4, 5, 6, 7);
    const v4 b = c > d ? c : d;
    const float e = b[0] > b[2] ? b[0] : b[2], f = b[1] > b[3] ? b[1] : b[3];
    return e > f ? e : f;
}

inline vf vsqrt(vf a) {
    vf r{};
    for (int l = 0; l < L; ++l) r[l] = std::sqrt(a[l]);
    return r;
}

// floor for |a| < 2**31 (exp's range reduction stays far inside that)
inline vf vfloor(vf a) {
    const vf truncated = __builtin_convertvector(__builtin_convertvector(a, vi), vf);
    return truncated > a ? truncated - splat(1.0f) : truncated;
}

// exp(x - k ln 2) for an integer-valued k near x / ln 2: the reduction (ln 2 in two parts) and the polynomial
// that vexp and the locality kernel's exp_nonpositive share
inline vf exp_reduced(vf x, vf k) {
    x = x - k * splat(0.693359375f) - k * splat(-2.12194440e-4f);  // x - k ln 2, in two parts
    const vf z = x * x;
    vf p = splat(1.9875691500e-4f);
    p = p * x + splat(1.3981999507e-3f);
    p = p * x + splat(8.3334519073e-3f);
    p = p * x + splat(4.1665795894e-2f);
    p = p * x + splat(1.6666665459e-1f);
    p = p * x + splat(5.0000001201e-1f);
    return p * z + x + splat(1.0f);
}

// exp(x); 0 below about -87.3, +inf above about 88.7
inline vf vexp(vf x) {
    const vf hi = splat(88.7228391f), lo = splat(-87.3365447f);
    const vi under = x < lo, over = x > hi;
    x = x > hi ? hi : x;
    x = x < lo ? lo : x;
    const vf k = vfloor(x * splat(1.44269504088896341f) + splat(0.5f));
    const vf p = exp_reduced(x, k);
    const vi bits = (__builtin_convertvector(k, vi) + 127) << 23;  // 2^k
    vf r = p * (vf)bits;
    r = under ? splat(0.0f) : r;
    return over ? splat(INFINITY) : r;
}

// log(x) for normal x > 0 (callers pass gaps > 0; other lanes are masked out afterwards)
inline vf vlog(vf x) {
    const vi bits = (vi)x;
    vi e = ((bits >> 23) & 0xff) - 126;                       // x = m 2^e with m in [0.5, 1)
    vf m = (vf)((bits & 0x007fffff) | 0x3f000000);
    const vi small = m < splat(0.707106781186547524f);         // m in [sqrt(1/2), sqrt(2)) after this
    e = small ? e - 1 : e;
    m = small ? m + m - splat(1.0f) : m - splat(1.0f);
    const vf z = m * m;
    vf p = splat(7.0376836292e-2f);
    p = p * m + splat(-1.1514610310e-1f);
    p = p * m + splat(1.1676998740e-1f);
    p = p * m + splat(-1.2420140846e-1f);
    p = p * m + splat(1.4249322787e-1f);
    p = p * m + splat(-1.6668057665e-1f);
    p = p * m + splat(2.0000714765e-1f);
    p = p * m + splat(-2.4999993993e-1f);
    p = p * m + splat(3.3333331174e-1f);
    const vf ef = __builtin_convertvector(e, vf);
    vf y = p * m * z + ef * splat(-2.12194440e-4f) - splat(0.5f) * z;
    return m + y + ef * splat(0.693359375f);
}

// log2(x) for x > 0 and 2**y, accurate to a few float32 ulps. With AVX-512: the exponent and mantissa from
// getexp/getmant, log2 of the mantissa in [sqrt(1/2), sqrt(2)) as t P(t), t = m - 1, P of degree 8 (relative error
// 3e-8), and 2**y as 2**round(y) (scalef, which also underflows to 0 and overflows to inf) times a degree-6
// polynomial on [-1/2, 1/2] (relative error 2e-9): about half the instructions of the Cephes pair above.
// Elsewhere: the Cephes functions.
#if defined(__AVX512F__)
inline vf vlog2(vf x) {
    const __m512 v = (__m512)x;
    __m512 m = _mm512_getmant_ps(v, _MM_MANT_NORM_1_2, _MM_MANT_SIGN_src);  // x = m 2**e, m in [1, 2)
    __m512 e = _mm512_getexp_ps(v);
    const __mmask16 big = _mm512_cmp_ps_mask(m, _mm512_set1_ps(1.41421356f), _CMP_GT_OQ);
    m = _mm512_mask_mul_ps(m, big, m, _mm512_set1_ps(0.5f));
    e = _mm512_mask_add_ps(e, big, e, _mm512_set1_ps(1.0f));
    const __m512 t = _mm512_sub_ps(m, _mm512_set1_ps(1.0f));
    __m512 p = _mm512_set1_ps(0.12583728134632111f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.20726987719535828f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.21571557223796844f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.23894479870796204f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.28791624307632446f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.3607036769390106f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.48091062903404236f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.7213473320007324f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.4426950216293335f));
    return (vf)_mm512_fmadd_ps(t, p, e);
}

inline vf vexp2(vf y) {
    const __m512 v = (__m512)y;
    const __m512 k = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(v, k);  // in [-1/2, 1/2]
    __m512 p = _mm512_set1_ps(0.00015345901192631572f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.0013399932067841291f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.009618489071726799f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.05550328642129898f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.24022646248340607f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.6931471824645996f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return (vf)_mm512_scalef_ps(p, k);
}
#else
inline vf vlog2(vf x) { return vlog(x) * splat(1.44269504088896341f); }
inline vf vexp2(vf y) { return vexp(y * splat(0.693147180559945309f)); }
#endif

// 1 / x to about 14 bits (AVX-512's estimate), exact elsewhere
inline vf vrcp(vf x) {
#if defined(__AVX512F__)
    return (vf)_mm512_rcp14_ps((__m512)x);
#else
    return splat(1.0f) / x;
#endif
}

// x ** e for x > 0, and 0 where x <= 0 (the gaps outside the support); e > 0, one per lane
inline vf vpow_gap(vf x, vf e) {
    const vi positive = x > splat(0.0f);
    const vf safe = positive ? x : splat(1.0f);
    return positive ? vexp2(e * vlog2(safe)) : splat(0.0f);
}

// Lane masks as bits (lane l is bit l), and the compaction of the selected lanes: compress_store writes the lanes
// of v whose bit is set, in order, to dst[0, count) (a whole vector is written: dst needs L floats of room);
// expand_load is its inverse, the next count floats of src into the selected lanes, 0 elsewhere (a whole vector is
// read). vcompressps/vexpandps on registers with AVX-512 (their memory forms are slow on some CPUs), lane loops
// elsewhere.
#if defined(__AVX512F__)
inline uint32_t lane_bits(vi mask) { return _mm512_test_epi32_mask((__m512i)mask, (__m512i)mask); }

inline void compress_store(float *dst, vf v, uint32_t bits) {
    _mm512_storeu_ps(dst, _mm512_maskz_compress_ps(__mmask16(bits), (__m512)v));
}

inline vf expand_load(const float *src, uint32_t bits) {
    __m512 v = _mm512_loadu_ps(src);
    asm("" : "+v"(v));  // keeps the load apart: compilers fold it into vexpandps' memory form, slow on Zen 4
    return (vf)_mm512_maskz_expand_ps(__mmask16(bits), v);
}
#else
inline uint32_t lane_bits(vi mask) {
    uint32_t bits = 0;
    for (int l = 0; l < L; ++l) bits |= uint32_t(mask[l] != 0) << l;
    return bits;
}

inline void compress_store(float *dst, vf v, uint32_t bits) {
    int count = 0;
    for (int l = 0; l < L; ++l) {
        dst[count] = v[l];
        count += (bits >> l) & 1;
    }
}

inline vf expand_load(const float *src, uint32_t bits) {
    vf v{};
    int next = 0;
    for (int l = 0; l < L; ++l) {
        if ((bits >> l) & 1) v[l] = src[next++];
    }
    return v;
}
#endif

inline int count_bits(uint32_t bits) { return __builtin_popcount(bits); }

inline int count_bits64(uint64_t bits) { return __builtin_popcountll(bits); }

// 64 bits from 4 consecutive 16-bit words, lowest first (one load on little-endian CPUs)
inline uint64_t bits64(const uint16_t *p) {
    return uint64_t(p[0]) | uint64_t(p[1]) << 16 | uint64_t(p[2]) << 32 | uint64_t(p[3]) << 48;
}

// The low bits of `bits`, in order, into the set positions of `mask` (pdep with BMI2, a loop elsewhere)
inline uint64_t deposit_bits64(uint64_t bits, uint64_t mask) {
#if defined(__BMI2__)
    return _pdep_u64(bits, mask);
#else
    uint64_t out = 0;
    for (uint64_t m = mask; m; m &= m - 1, bits >>= 1) out |= (bits & 1u) ? (m & -m) : uint64_t(0);
    return out;
#endif
}

}  // namespace vitscope
