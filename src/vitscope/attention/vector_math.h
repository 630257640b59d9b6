// 16-lane float vectors (GCC/Clang vector extensions: AVX-512, AVX2 or NEON, whatever -march gives) and the
// few functions the sparse normalisers need on them: sqrt, and exp/log/pow accurate to a few float32 ulps
// (Cephes' single-precision polynomials) for alpha-entmax.
#pragma once

#include <cmath>
#include <cstdint>

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

// exp(x); 0 below about -87.3, +inf above about 88.7
inline vf vexp(vf x) {
    const vf hi = splat(88.7228391f), lo = splat(-87.3365447f);
    const vi under = x < lo, over = x > hi;
    x = x > hi ? hi : x;
    x = x < lo ? lo : x;
    const vf k = vfloor(x * splat(1.44269504088896341f) + splat(0.5f));
    x = x - k * splat(0.693359375f) - k * splat(-2.12194440e-4f);  // x - k ln 2, in two parts
    const vf z = x * x;
    vf p = splat(1.9875691500e-4f);
    p = p * x + splat(1.3981999507e-3f);
    p = p * x + splat(8.3334519073e-3f);
    p = p * x + splat(4.1665795894e-2f);
    p = p * x + splat(1.6666665459e-1f);
    p = p * x + splat(5.0000001201e-1f);
    p = p * z + x + splat(1.0f);
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

// x ** e for x > 0, and 0 where x <= 0 (the gaps outside the support); e > 0, one per lane
inline vf vpow_gap(vf x, vf e) {
    const vi positive = x > splat(0.0f);
    const vf safe = positive ? x : splat(1.0f);
    return positive ? vexp(e * vlog(safe)) : splat(0.0f);
}

}  // namespace vitscope
