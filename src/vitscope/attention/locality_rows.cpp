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
// Per map the keys are transposed once into a scaled (head_dim x Tk) panel, and each group of G query rows into a
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

// x in every lane: x - 0 is x for every x, so this is one broadcast (splat's 0 + x is not x for x = -0, so it
// costs a scalar add per use in the logits loop)
inline vf broadcast(float x) { return x - vf{}; }

struct Shape {
    int64_t tq, tk, dim, prefix;
    int64_t q_row, k_row;  // row strides (floats) of one map's queries and keys
    int64_t padded;        // keys rounded up to whole vectors
};

// The map sums (rows with patch mass, sum of renormalised distances, of raw distances, of entropies) of one map.
// dist: (tq - prefix) x padded, zero on prefix and padding keys. Scratch: panel (dim x padded), block (dim x G),
// rows (G x padded).
void locality_map(const float *q, const float *k, const float *dist, float scale, const Shape &n, float *panel,
                  float *block, float *rows, double *sums) {
    const int64_t padded = n.padded;
    for (int64_t c = 0; c < n.dim; ++c) {
        float *line = panel + c * padded;
        for (int64_t j = 0; j < n.tk; ++j) line[j] = k[j * n.k_row + c] * scale;
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
        for (int64_t j = 0; j < padded; j += L) {
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
        // per row: Z over all keys; P, W and S over patch keys
        float z[G], patch[G], dist_sum[G], shifted_sum[G];
        for (int g = 0; g < count; ++g) {
            const float *row = rows + g * padded, *d = dist + (i0 + g - n.prefix) * padded;
            const vf mv = broadcast(hmax(top[g]));
            vf zv{}, ev{}, wv{}, sv{};
            for (int64_t j = 0; j < padded; j += L) {
                vf shifted, distances;
                std::memcpy(&shifted, row + j, sizeof(vf));
                std::memcpy(&distances, d + j, sizeof(vf));
                shifted -= mv;
                vf e = vexp(shifted);  // 0 on padding keys
                zv += e;
                if (j < n.prefix) e = lane + broadcast(float(j)) >= broadcast(float(n.prefix)) ? e : splat(0.0f);
                ev += e;
                wv += e * distances;
                sv += e > splat(0.0f) ? e * shifted : splat(0.0f);  // 0 where e underflows, not 0 * -inf
            }
            z[g] = hsum(zv), patch[g] = hsum(ev), dist_sum[g] = hsum(wv), shifted_sum[g] = hsum(sv);
        }
        vf normal = splat(1.0f);  // vlog takes normal numbers; other rows are left out or logged one by one
        for (int g = 0; g < count; ++g) normal[g] = patch[g] >= FLT_MIN ? patch[g] : 1.0f;
        const vf log_patch = vlog(normal);
        for (int g = 0; g < count; ++g) {
            if (!(patch[g] > 0.0f)) continue;  // no patch mass: left out of every mean
            const double p = patch[g];
            sums[0] += 1.0;
            sums[1] += dist_sum[g] / p;
            sums[2] += double(dist_sum[g]) / z[g];
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
    const Shape shape{tq, tk, dim, prefix, q_strides[2], k_strides[2], padded};
    std::vector<float> aligned(out_rows * padded, 0.0f);  // each query's distances at its keys' positions
    for (int64_t i = 0; i < out_rows; ++i)
        std::memcpy(aligned.data() + i * padded + prefix, dist + i * patches, patches * sizeof(float));
    in_parallel(batch * heads, 1, threads, [&](int64_t first, int64_t last) {
        std::vector<float> panel(dim * padded), block(dim * G), rows(G * padded);
        for (int64_t map = first; map < last; ++map) {
            const int64_t b = map / heads, h = map % heads;
            locality_map(q + b * q_strides[0] + h * q_strides[1], k + b * k_strides[0] + h * k_strides[1],
                         aligned.data(), scale, shape, panel.data(), block.data(), rows.data(), sums + map * 4);
        }
    });
}

}  // extern "C"
