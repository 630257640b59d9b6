// The closed-form backward of alpha-entmax on the CPU, with the gradient with respect to alpha, on each row's
// support only. Included by sparse_rows.cpp.
#pragma once

#include <cstdint>
#include <cstring>

#include "row_tiles.h"
#include "vector_math.h"

namespace vitscope {

// The backward of G consecutive rows (n apart) on their supports only (packed by vector compaction):
// w = y ** (2 - alpha), grad_x = w g - w sum(w g) / sum(w); with d_alpha (one per row), also (Correia et al.,
// 2019, as in the entmax package) (sum g y - m) / (a - 1)**2 - (sum g y log y - m sum y log y) / (a - 1),
// m = sum(w g) / sum(w); 0 for a = 1. Each phase runs over the G rows before the next: the rows' chains (powers,
// then sums, then the mean the output needs) are independent and overlap. `packed` holds G x 3 x width floats
// and then G x chunks uint32 (width and chunks as AlphaScratch's).
constexpr int BACKWARD_ROWS = 2;  // G: 2 is 5-18% faster than 1 on Zen 4 (fp32 / bf16); 4 and 8 are slower

template <int G, typename T>
void alpha_backward_rows(const T *g, const T *y, T *o, float *d_alpha, int64_t n, const float *alphas,
                         float *packed, int64_t width) {
    const int64_t chunks = (n + L - 1) / L;
    uint32_t *all_bits = reinterpret_cast<uint32_t *>(packed + G * 3 * width);
    const vf zero{}, ln2 = splat(0.693147180559945309f);
    int kept[G];
    for (int k = 0; k < G; ++k) {
        const T *gr = g + k * n, *yr = y + k * n;
        float *py = packed + k * 3 * width, *pg = py + width;
        uint32_t *bits = all_bits + k * chunks;
        int count = 0;
        for (int64_t i = 0, c = 0; i < n; i += L, ++c) {
            const vf yv = load_chunk(yr, i, n, 0.0f);
            const uint32_t support = lane_bits(yv > zero);  // in a register: the vector stores may alias `bits`
            bits[c] = support;
            compress_store(pg + count, load_chunk(gr, i, n, 0.0f), support);
            compress_store(py + count, yv, support);
            count += count_bits(support);
        }
        kept[k] = count;
    }
    vi lane;
    for (int l = 0; l < L; ++l) lane[l] = l;
    float mean[G];
    for (int k = 0; k < G; ++k) {
        float *py = packed + k * 3 * width, *pg = py + width, *pw = pg + width;
        const vf exponent = splat(2.0f - alphas[k]);
        vf wgv{}, wv{}, gyv{}, gsv{}, sv{};
        for (int64_t i = 0; i < kept[k]; i += L) {
            const vi inside = lane < int(kept[k] - i);  // the packed entries: all of them have y > 0
            const vf yv = inside ? load16(py + i) : zero, gv = inside ? load16(pg + i) : zero;
            const vf log2y = vlog2(inside ? yv : splat(1.0f));
            const vf weight = inside ? vexp2(exponent * log2y) : zero;
            std::memcpy(pw + i, &weight, sizeof weight);
            wgv += weight * gv;
            wv += weight;
            if (d_alpha) {
                const vf ylogy = yv * log2y * ln2;
                gyv += gv * yv;
                gsv += gv * ylogy;
                sv += ylogy;
            }
        }
        mean[k] = hsum(wgv) / hsum(wv);
        if (d_alpha) {
            const float am1 = alphas[k] - 1.0f;
            d_alpha[k] = am1 == 0.0f ? 0.0f  // alpha = 1 is softmax, whose alpha gradient is taken as 0
                                     : (hsum(gyv) - mean[k]) / (am1 * am1) - (hsum(gsv) - mean[k] * hsum(sv)) / am1;
        }
    }
    for (int k = 0; k < G; ++k) {
        const T *gr = g + k * n;
        T *orow = o + k * n;
        const float *pw = packed + k * 3 * width + 2 * width;
        const uint32_t *bits = all_bits + k * chunks;
        const vf m = splat(mean[k]);
        int used = 0;
        for (int64_t i = 0, c = 0; i < n; i += L, ++c) {
            const uint32_t support = bits[c];
            const vf weight = expand_load(pw + used, support);
            used += count_bits(support);
            store_chunk(orow, i, n, weight * (load_chunk(gr, i, n, 0.0f) - m));
        }
    }
}

}  // namespace vitscope
