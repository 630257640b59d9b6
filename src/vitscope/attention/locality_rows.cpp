// Streaming locality statistics of softmax attention, without materialising the probabilities.
//
// For each query row i of logits s (T keys, the first `prefix` of them CLS/register tokens) with
// p = softmax(s), restricted to the patch keys j >= prefix and patch queries i >= prefix:
//   mass_i = sum_j p_ij,  weighted_i = sum_j p_ij d_ij,  plogp_i = sum_j p_ij log p_ij.
// With e_j = exp(s_j - max) and Z = sum over all keys of e_j, p_j = e_j / Z and log p_j = s_j - max - log Z, so
// two in-cache passes over a row give all three: its maximum, then the sums of e_j, e_j d_ij and e_j (s_j - max).
// These are the row sums of vitscope.metrics.locality.locality_row_sums, which turns them into MAD and entropy.

#include <cmath>
#include <cstdint>
#include <cstring>

#include "parallel.h"
#include "vector_math.h"

namespace {

using namespace vitscope;

// The 16 floats at p, or the first `width` of them and `fill` after them (the tail of a row).
inline vf load(const float *p, int64_t width, float fill) {
    vf v = splat(fill);
    if (width >= L) {
        std::memcpy(&v, p, sizeof(vf));
    } else {
        for (int64_t l = 0; l < width; ++l) v[l] = p[l];
    }
    return v;
}

// rows [first, last) of the (batch x heads x patches) output; s is (batch x heads x T x T), dist (patches x patches).
// Four rows at a time: their chains (maximum, then sums, then the scalar tail) are independent and overlap.
void locality_rows(const float *s, const float *dist, float *mass, float *weighted, float *plogp, int64_t first,
                   int64_t last, int64_t t, int64_t prefix) {
    constexpr int R = 4;
    const int64_t patches = t - prefix;
    for (int64_t r0 = first; r0 < last; r0 += R) {
        const int count = last - r0 < R ? int(last - r0) : R;
        const float *row[R], *d[R];
        for (int q = 0; q < R; ++q) {
            const int64_t r = r0 + (q < count ? q : 0), map = r / patches, query = r % patches;
            row[q] = s + (map * t + prefix + query) * t;
            d[q] = dist + query * patches;
        }
        vf top[R];
        for (int q = 0; q < R; ++q) top[q] = splat(-INFINITY);
        for (int64_t j = 0; j < t; j += L)
            for (int q = 0; q < R; ++q) {
                const vf v = load(row[q] + j, t - j, -INFINITY);
                top[q] = v > top[q] ? v : top[q];
            }
        vf mv[R], ev[R], wv[R], sv[R];
        for (int q = 0; q < R; ++q) {
            mv[q] = splat(hmax(top[q]));
            ev[q] = wv[q] = sv[q] = vf{};
        }
        for (int64_t j = 0; j < patches; j += L)
            for (int q = 0; q < R; ++q) {
                const vf shifted = load(row[q] + prefix + j, patches - j, -INFINITY) - mv[q];  // tail: e = 0
                const vf e = vexp(shifted);
                ev[q] += e;
                wv[q] += e * load(d[q] + j, patches - j, 0.0f);
                sv[q] += e > splat(0.0f) ? e * shifted : splat(0.0f);  // 0 where s = -inf, not 0 * -inf
            }
        for (int q = 0; q < count; ++q) {
            const float m = mv[q][0], patch_sum = hsum(ev[q]);
            float z = patch_sum;
            for (int64_t j = 0; j < prefix; ++j) z += std::exp(row[q][j] - m);
            const int64_t r = r0 + q;
            mass[r] = patch_sum / z;
            weighted[r] = hsum(wv[q]) / z;
            plogp[r] = hsum(sv[q]) / z - mass[r] * std::log(z);
        }
    }
}

}  // namespace

extern "C" {

// s: (maps x T x T) float32 logits, maps = batch x heads; dist: (T - prefix) x (T - prefix); outputs:
// (maps x (T - prefix)) each.
void vitscope_softmax_locality(const float *s, const float *dist, float *mass, float *weighted, float *plogp,
                               int64_t maps, int64_t t, int64_t prefix, int threads) {
    const int64_t rows = maps * (t - prefix);
    in_parallel(rows, 1, threads, [&](int64_t first, int64_t last) {
        locality_rows(s, dist, mass, weighted, plogp, first, last, t, prefix);
    });
}

}  // extern "C"
