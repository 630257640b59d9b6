// alpha-entmax on the CPU, one alpha per row in (1, 2]: the forward for a block of up to 16 rows and the
// closed-form backward of one row, with the gradient with respect to alpha. Included by sparse_rows.cpp.
//
// Forward: y = [z - tau]_+ ** p / sum, z = (alpha - 1) (x - max), p = 1 / (alpha - 1).
// * Pruning. tau >= -1 (the top key alone has mass 1 there), so only keys with z > -1 can be in the support.
//   Each row is read row-major (vector loads, no transpose), and its survivors are packed (vector compaction);
//   only those, transposed 16 rows to the 16 lanes, enter the Newton passes: on attention-like rows a fifth to
//   a twentieth of the keys. A row is accepted only if its final tau is at or above every pruned key.
// * Newton on ||[z - tau]_+||_p - 1 (convex: from below it never overshoots the root), from the lower bound
//   max(-1, mean(z) - k**(-1/p)) over the k survivors (Jensen: their mass alone is at least 1 there). Each pass
//   takes one power per survivor: q = gap**(p - 1), with sum(q gap) and sum(q). A row is done when its step is
//   below 16 float32 ulps of 1 (the eager solver's tolerance).
// * No separate output pass: that last pass's q give y at tau + step to first order, q (gap - p step), the
//   neglected term being of order step**2 (step <= 2e-6 there); then renormalised, and written back to the
//   rows through the same transposes and a vector expansion.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "row_tiles.h"
#include "vector_math.h"

namespace vitscope {

// Each row's alpha: values[((first + row) / inner) % period]. One value for all rows: inner = period = 1; one
// per row: inner 1, period = the rows; one per head of (batch, heads, queries) rows: inner = queries, period =
// heads. The values are those of the caller's alpha tensor itself, never a per-row copy.
struct Alphas {
    const float *values = nullptr;
    int64_t inner = 1, period = 1, first = 0;
    int64_t index(int64_t row) const { return (first + row) / inner % period; }
    float operator[](int64_t row) const { return values[index(row)]; }
    Alphas from(int64_t row) const { return {values, inner, period, first + row}; }  // rows [row, ...) as 0, 1, ...
};

// One thread's buffers for blocks of 16 rows of n keys: `width` is n rounded up to L, plus L of room for the
// whole-vector stores of the compaction.
struct AlphaScratch {
    int64_t width = 0, chunks = 0;
    vf *lanes = nullptr;       // width: the survivors' z, one row per lane, then the output
    vf *powers = nullptr;      // width: q = gap ** (p - 1) at the current tau
    float *packed = nullptr;   // L x width: each row's survivors, row-major
    uint32_t *kept = nullptr;  // which keys of each 16 survived, as bits: L x chunks, then from L (chunks + 1)
                               // on, L x (chunks + 1) for the second level (over the first level's survivors)

    explicit AlphaScratch(int64_t n) : width((n + L - 1) / L * L + L), chunks((n + L - 1) / L) {
        lanes = static_cast<vf *>(std::aligned_alloc(sizeof(vf), size_t(width) * sizeof(vf)));
        powers = static_cast<vf *>(std::aligned_alloc(sizeof(vf), size_t(width) * sizeof(vf)));
        packed = static_cast<float *>(std::aligned_alloc(sizeof(vf), size_t(width) * L * sizeof(float)));
        kept = static_cast<uint32_t *>(std::malloc(size_t(chunks + 1) * 2 * L * sizeof(uint32_t)));
    }
    ~AlphaScratch() {
        std::free(lanes);
        std::free(powers);
        std::free(packed);
        std::free(kept);
    }
    AlphaScratch(const AlphaScratch &) = delete;
    AlphaScratch &operator=(const AlphaScratch &) = delete;
    bool ok() const { return lanes && powers && packed && kept; }
};

template <typename T>
void solve_alpha_block(const T *x, T *y, uint8_t *ok, int rows, int64_t n, int max_iter, AlphaScratch &work,
                       Alphas alpha) {
    const float tol = 16.0f * 1.1920929e-7f, inf = INFINITY;
    const vf zero{}, one = splat(1.0f), ninf = splat(-inf);
    vf a;
    for (int l = 0; l < L; ++l) a[l] = alpha[l < rows ? l : 0];
    const vi valid = (a > one) & (a <= splat(2.0f));
    const vf scale = valid ? a - one : splat(0.5f), power = one / scale, power_m1 = power - one;

    // Row-major, each row: its maximum (and its sum, NaN if it holds a NaN), then its survivors z > -1 packed,
    // with their sum. The keys pruned here have z <= -1, at or below the root (it is at least -1): -1 stands for
    // the largest of them in the final check. Rows with NaN, +inf, nothing above -inf or alpha outside (1, 2] stay
    // open (passes 0): the caller's solver decides those.
    vi live{};
    vf pruned_top = ninf, count{}, sum{};
    for (int l = 0; l < rows; ++l) {
        const T *xr = x + l * n;
        vf top = ninf, nan_sum{};  // the row's sum: NaN if the row holds a NaN (or both infinities)
        for (int64_t i = 0; i < n; i += L) {
            const vf v = load_chunk(xr, i, n, -inf);
            top = v > top ? v : top;
            nan_sum += v;
            __builtin_prefetch(xr + L * n + i, 0, 1);  // the same row of the next block
        }
        const float max = hmax(top);
        if (!(valid[l] && max > -inf && max < inf) || lane_bits(nan_sum != nan_sum)) continue;
        float *packed = work.packed + l * work.width;
        uint32_t *kept = work.kept + l * work.chunks;
        const vf m = splat(max), s = splat(scale[l]);
        vf total{};
        int survivors = 0;
        for (int64_t i = 0, c = 0; i < n; i += L, ++c) {
            const vf z = s * (load_chunk(xr, i, n, -inf) - m);
            const vi in = z > -one;
            total += in ? z : zero;
            const uint32_t bits = lane_bits(in);  // kept in a register: the vector store below may alias `kept`
            kept[c] = bits;
            compress_store(packed + survivors, z, bits);
            survivors += count_bits(bits);
        }
        live[l] = -1;
        pruned_top[l] = -1.0f;
        count[l] = float(survivors);
        sum[l] = hsum(total);
    }

    // The first Newton pass, row by row on the packed survivors, from the lower bound mean(z) - k**(-1/p) over
    // the k survivors (Jensen: their mass alone is 1 there), or -1. Its result is a tighter lower bound.
    vi lane;
    for (int l = 0; l < L; ++l) lane[l] = l;
    vf tau = sum / count - vexp2(-scale * vlog2(count));
    tau = tau > -one ? tau : -one;
    vf totals{}, slopes{};
    for (int l = 0; l < rows; ++l) {
        if (!live[l]) continue;
        const float *packed = work.packed + l * work.width;
        const vf t = splat(tau[l]), e = splat(power_m1[l]);
        vf total{}, slope{};
        for (int64_t i = 0; i < int64_t(count[l]); i += L) {
            const vf gap = (lane < int(count[l] - i) ? load16(packed + i) : ninf) - t;
            const vf q = vpow_gap(gap, e);
            total += q * (gap > zero ? gap : zero);
            slope += q;
        }
        totals[l] = hsum(total);
        slopes[l] = hsum(slope);
    }
    tau = live ? tau + (totals - vexp2((one - scale) * vlog2(totals))) / slopes : tau;

    // Prune again at that tau, in place: the second-level survivors, with their bits over the first level's
    int level2[L] = {}, most = 0;
    for (int l = 0; l < rows; ++l) {
        if (!live[l]) continue;
        float *packed = work.packed + l * work.width;
        uint32_t *again = work.kept + (L + l) * (work.chunks + 1);
        const vf t = splat(tau[l]);
        vf out = ninf;
        int survivors = 0;
        for (int64_t i = 0, c = 0; i < int64_t(count[l]); i += L, ++c) {
            const vf z = lane < int(count[l] - i) ? load16(packed + i) : ninf;
            const vi in = z > t;
            out = in ? out : (z > out ? z : out);
            const uint32_t bits = lane_bits(in);
            again[c] = bits;
            compress_store(packed + survivors, z, bits);
            survivors += count_bits(bits);
            again[c + 1] = 0;  // read past the last chunk's bits, as zeros
        }
        const float pruned = hmax(out);
        pruned_top[l] = pruned > pruned_top[l] ? pruned : pruned_top[l];
        level2[l] = survivors;
        most = survivors > most ? survivors : most;
    }

    // The survivors to the lanes (16 x 16 transposes), -inf past each row's end
    const int64_t span = (most + L - 1) / L * L;  // whole tiles
    for (int l = 0; l < L; ++l) {  // whole vectors: packed has L floats of room past any span
        float *packed = work.packed + l * work.width;
        for (int64_t i = level2[l]; i < span; i += L) std::memcpy(packed + i, &ninf, sizeof(vf));
    }
    vf *lanes = work.lanes, *powers = work.powers;
    for (int64_t i0 = 0; i0 < span; i0 += L) {
        vf t[L];
        for (int l = 0; l < L; ++l) t[l] = load16(work.packed + l * work.width + i0);
        transpose16(t);
        for (int c = 0; c < L; ++c) lanes[i0 + c] = t[c];
    }

    vf step{};
    vi passes{};
    for (int pass = 2; pass <= max_iter && most > 0; ++pass) {
        vf total{}, slope{};  // sum of gap**p and of gap**(p - 1) over the support
        for (int64_t i = 0; i < most; ++i) {
            const vf gap = lanes[i] - tau;
            const vf q = vpow_gap(gap, power_m1);
            powers[i] = q;
            total += q * (gap > zero ? gap : zero);
            slope += q;
        }
        const vf norm_term = vexp2((one - scale) * vlog2(total));  // total ** (1 - 1/p)
        const vf next = (total - norm_term) / slope;
        const vi open = live & (passes == 0);
        const vi small = (next <= splat(tol)) & (next >= splat(-tol));
        step = open ? next : step;
        passes = (open & small) ? vi{} + pass : passes;
        tau = (open & ~small) ? tau + next : tau;
        bool left = false;
        for (int l = 0; l < rows; ++l) left |= passes[l] == 0 && live[l];
        if (!left) break;
    }
    passes = (pruned_top <= tau + step) ? passes : vi{};  // a pruned key would be in the support: not exact

    // y at tau + step from the last pass's powers, renormalised, back to the rows through the transposes and the
    // two levels of expansion
    vf total{};
    const vf shift = power * step;
    for (int64_t i = 0; i < span; ++i) {
        const vf gap = lanes[i] - tau - shift;
        lanes[i] = i < most ? powers[i] * (gap > zero ? gap : zero) : zero;
        total += lanes[i];
    }
    const vf inverse = one / total;
    for (int64_t i0 = 0; i0 < span; i0 += L) {
        vf t[L];
        for (int c = 0; c < L; ++c) t[c] = lanes[i0 + c] * inverse;
        transpose16(t);
        for (int l = 0; l < L; ++l) std::memcpy(work.packed + l * work.width + i0, &t[l], sizeof(vf));
    }
    for (int l = 0; l < rows; ++l) {
        ok[l] = passes[l] > 0;
        if (!ok[l]) continue;  // the caller's solver writes this row
        const float *packed = work.packed + l * work.width;
        const uint32_t *kept = work.kept + l * work.chunks, *again = work.kept + (L + l) * (work.chunks + 1);
        T *yr = y + l * n;
        int first = 0, used = 0;  // entries of the first level and of the second seen so far
        for (int64_t i = 0, c = 0; i < n; i += L, ++c) {
            // the second level's bits for this chunk's first-level survivors, put in their places in the row
            const int word = first >> 4, count = count_bits(kept[c]);
            const uint32_t window = count ? (again[word] | (again[word + 1] << 16)) >> (first & 15) : 0;
            const uint32_t bits = deposit_bits(window & ((1u << count) - 1), kept[c]);
            store_chunk(yr, i, n, expand_load(packed + used, bits));
            first += count;
            used += count_bits(bits);
        }
    }
}

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
