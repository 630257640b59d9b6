// Streaming locality statistics of softmax attention straight from queries and keys: neither the logits nor the
// probabilities are ever materialised beyond one row group in L1.
//
// For each (image, head) map, each patch query row i >= prefix of s = scale q k^T (Tq x Tk, the first `prefix`
// queries and keys CLS/register tokens) with p = softmax(s), over the patch keys j >= prefix:
//   P_i = sum_j e_ij,  W_i = sum_j e_ij d_ij,  S_i = sum_j e_ij (s_ij - max_i),  with e_ij = exp(s_ij - max_i),
// and Z_i the sum of e over all keys. Then the patch mass is m_i = P_i / Z_i, the renormalised distance
// sum_j p d / m = W_i / P_i, the raw one W_i / Z_i, and the renormalised entropy
// -sum_j (p/m) log(p/m) = log P_i - S_i / P_i (Z cancels). Summed over the rows with patch mass, with their
// count, these are vitscope.metrics.locality.map_sums, which locality_from_map_sums turns into MAD and entropy.
//
// Per map the keys are transposed once into a scaled (head_dim x Tk) panel, patch keys first, and each group of G query rows into a
// (head_dim x G) block; the group's logits are then formed one panel vector and G fused multiply-adds (each with
// its query element broadcast from the block) at a time. q and k are read with their strides (the head dim
// contiguous), so the views PyTorch's attention takes of its qkv projection need no copy.

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "parallel.h"
#include "vector_math.h"

namespace {

using namespace vitscope;

constexpr int G = 8;  // query rows whose logits are formed together (8 accumulators + 1 panel vector in registers)
typedef float rows_g __attribute__((vector_size(4 * G)));  // one value per row of a group

// x in every lane: x - 0 is x for every x, so this is one broadcast (splat's 0 + x is not x for x = -0, so it
// costs a scalar add per use in the logits loop)
inline vf broadcast(float x) { return x - vf{}; }

// exp(x) for x <= 0 (x - max of a row), 0 below about -87.3 and for -inf: vitscope's vexp without the overflow
// guard, rounding by the 1.5 * 2^23 shift (whose low mantissa bits then hold k) instead of a floor.
inline vf exp_nonpositive(vf x) {
    const vf lo = splat(-87.3365447f), shift = splat(12582912.0f);
    const vi under = x < lo;
    x = under ? lo : x;
    const vf t = x * splat(1.44269504088896341f) + shift;  // k = round(x / ln 2), in t's low bits
    const vf k = t - shift;
    const vf p = exp_reduced(x, k);
    const vi bits = ((vi)t - (vi)shift + 127) << 23;  // 2^k
    const vf r = p * (vf)bits;
    return under ? splat(0.0f) : r;
}

struct Shape {
    int64_t tq, tk, dim, prefix;
    int64_t q_row, k_row;  // row strides (floats) of one map's queries and keys
    int64_t padded;        // keys rounded up to whole vectors
    int64_t patches;       // patch keys (tk - prefix)
};

// The map sums (rows with patch mass, sum of renormalised distances, of raw distances, of entropies) of one map.
// Keys sit in panel order: the patch keys first (so that they fill whole vectors), then the prefix keys, then
// padding. dist: (tq - prefix) x padded in that order, zero after the patch keys. Scratch: panel (dim x padded),
// block (dim x G), rows (G x padded).
void locality_map(const float *q, const float *k, const float *dist, float scale, const Shape &n, float *panel,
                  float *block, float *rows, double *sums) {
    const int64_t padded = n.padded, patches = n.patches;
    const int64_t blocked = n.tk % L != 0 && n.tk % L <= 4 ? n.tk / L * L : padded;  // keys taken a vector at a time
    for (int64_t c = 0; c < n.dim; ++c) {
        float *line = panel + c * padded;
        for (int64_t j = 0; j < patches; ++j) line[j] = k[(n.prefix + j) * n.k_row + c] * scale;
        for (int64_t j = 0; j < n.prefix; ++j) line[patches + j] = k[j * n.k_row + c] * scale;
        for (int64_t j = n.tk; j < padded; ++j) line[j] = 0.0f;
    }
    vf lane{};
    for (int l = 0; l < L; ++l) lane[l] = float(l);
    for (int i = 0; i < 4; ++i) sums[i] = 0.0;
    for (int64_t i0 = n.prefix; i0 < n.tq; i0 += G) {
        const int count = n.tq - i0 < G ? int(n.tq - i0) : G;
        for (int g = 0; g < G; ++g) {
            const float *query = q + (i0 + (g < count ? g : 0)) * n.q_row;
            for (int64_t c = 0; c < n.dim; ++c) block[c * G + g] = query[c];
        }
        // logits of the group's rows, -inf on padding keys, and each row's maximum
        vf top[G];
        for (int g = 0; g < G; ++g) top[g] = splat(-INFINITY);
        for (int64_t j = 0; j < blocked; j += L) {
            vf acc[G];
            for (int g = 0; g < G; ++g) acc[g] = vf{};
            const float *column = block;
            for (int64_t c = 0; c < n.dim; ++c, column += G) {
                vf keys;
                std::memcpy(&keys, panel + c * padded + j, sizeof(vf));
                for (int g = 0; g < G; ++g) acc[g] += broadcast(column[g]) * keys;
            }
            const vi real = lane < broadcast(float(n.tk - j));
            for (int g = 0; g < G; ++g) {
                const vf live = real ? acc[g] : splat(-INFINITY);
                std::memcpy(rows + g * padded + j, &live, sizeof(vf));
                top[g] = live > top[g] ? live : top[g];
            }
        }
        // a few keys past the last whole vector (vit-compact's CLS): one column of G rows at a time, G times fewer
        // multiply-adds than a mostly empty vector of keys per row
        rows_g column_top = -INFINITY - rows_g{};
        if (blocked < padded) {
            for (int g = 0; g < G; ++g)
                for (int64_t j = blocked; j < padded; ++j) rows[g * padded + j] = -INFINITY;
            for (int64_t j = blocked; j < n.tk; ++j) {
                rows_g acc{};
                for (int64_t c = 0; c < n.dim; ++c) {
                    rows_g queries;
                    std::memcpy(&queries, block + c * G, sizeof(rows_g));
                    acc += queries * (panel[c * padded + j] - rows_g{});
                }
                for (int g = 0; g < G; ++g) rows[g * padded + j] = acc[g];
                column_top = acc > column_top ? acc : column_top;
            }
        }
        // the prefix keys' share of Z, one lane per row of the group
        vf maxima = splat(0.0f), prefix_z{};
        for (int g = 0; g < count; ++g) maxima[g] = std::fmax(hmax(top[g]), column_top[g]);
        for (int64_t j = 0; j < n.prefix; ++j) {
            vf logits = maxima;
            for (int g = 0; g < count; ++g) logits[g] = rows[g * padded + patches + j];
            prefix_z += exp_nonpositive(logits - maxima);
        }
        // per row over the patch keys: P, W and S
        float patch[G], dist_sum[G], shifted_sum[G];
        for (int g = 0; g < count; ++g) {
            const float *row = rows + g * padded, *d = dist + (i0 + g - n.prefix) * padded;
            const vf mv = broadcast(maxima[g]);
            vf ev{}, wv{}, sv{};
            for (int64_t j = 0; j < patches; j += L) {
                vf shifted, distances;
                std::memcpy(&shifted, row + j, sizeof(vf));
                std::memcpy(&distances, d + j, sizeof(vf));
                shifted -= mv;
                vf e = exp_nonpositive(shifted);
                if (patches - j < L) e = lane < broadcast(float(patches - j)) ? e : splat(0.0f);  // prefix keys
                ev += e;
                wv += e * distances;
                sv += e > splat(0.0f) ? e * shifted : splat(0.0f);  // 0 where e underflows, not 0 * -inf
            }
            patch[g] = hsum(ev), dist_sum[g] = hsum(wv), shifted_sum[g] = hsum(sv);
        }
        vf normal = splat(1.0f);  // vlog takes normal numbers; other rows are left out or logged one by one
        for (int g = 0; g < count; ++g) normal[g] = patch[g] >= FLT_MIN ? patch[g] : 1.0f;
        const vf log_patch = vlog(normal);
        for (int g = 0; g < count; ++g) {
            if (!(patch[g] > 0.0f)) continue;  // no patch mass: left out of every mean
            const double p = patch[g], z = p + prefix_z[g];
            sums[0] += 1.0;
            sums[1] += dist_sum[g] / p;
            sums[2] += dist_sum[g] / z;
            sums[3] += (patch[g] >= FLT_MIN ? log_patch[g] : std::log(p)) - shifted_sum[g] / p;
        }
    }
}

}  // namespace

extern "C" {

// q: (batch, heads, tq, dim) and k: (batch, heads, tk, dim) float32 with unit stride along dim and the given
// strides (floats) along batch, heads and tokens; dist: (tq - prefix) x (tk - prefix); sums: (batch x heads x 4)
// float64, the map sums. The logits are scale * q k^T.
void vitscope_softmax_locality(const float *q, const float *k, const float *dist, double *sums,
                               const int64_t *q_strides, const int64_t *k_strides, int64_t batch, int64_t heads,
                               int64_t tq, int64_t tk, int64_t dim, int64_t prefix, float scale, int threads) {
    const int64_t padded = (tk + L - 1) / L * L, out_rows = tq - prefix, patches = tk - prefix;
    const Shape shape{tq, tk, dim, prefix, q_strides[2], k_strides[2], padded, patches};
    std::vector<float> aligned(out_rows * padded, 0.0f);  // each query's distances in panel order
    for (int64_t i = 0; i < out_rows; ++i)
        std::memcpy(aligned.data() + i * padded, dist + i * patches, patches * sizeof(float));
    in_parallel(batch * heads, 1, threads, [&](RowChunks &maps) {
        std::vector<float> panel(dim * padded), block(dim * G), rows(G * padded);
        for (int64_t map, last; maps.next(map, last);) {  // chunks of one map
            const int64_t b = map / heads, h = map % heads;
            locality_map(q + b * q_strides[0] + h * q_strides[1], k + b * k_strides[0] + h * k_strides[1],
                         aligned.data(), scale, shape, panel.data(), block.data(), rows.data(), sums + map * 4);
        }
    });
}

}  // extern "C"
