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

    // Row-major, each row: its maximum, then its survivors z > -1 packed (with their sum), NaN, and the largest
    // pruned z (the final tau must not fall below it). Rows with NaN, +inf, nothing above -inf or alpha outside
    // (1, 2] stay open (passes 0): the caller's solver decides those.
    vi live{};
    vf pruned_top = ninf, count{}, sum{};
    for (int l = 0; l < rows; ++l) {
        const T *xr = x + l * n;
        vf top = ninf;
        for (int64_t i = 0; i < n; i += L) {
            const vf v = load_chunk(xr, i, n, -inf);
            top = v > top ? v : top;
            __builtin_prefetch(xr + L * n + i, 0, 1);  // the same row of the next block
        }
        const float max = hmax(top);
        if (!(valid[l] && max > -inf && max < inf)) continue;
        float *packed = work.packed + l * work.width;
        uint32_t *kept = work.kept + l * work.chunks;
        const vf m = splat(max), s = splat(scale[l]);
        vf out = ninf, total{};
        vi nan{};
        int survivors = 0;
        for (int64_t i = 0, c = 0; i < n; i += L, ++c) {
            const vf z = s * (load_chunk(xr, i, n, -inf) - m);
            const vi in = z > -one;
            nan |= z != z;
            out = in ? out : (z > out ? z : out);
            total += in ? z : zero;
            kept[c] = lane_bits(in);
            compress_store(packed + survivors, z, kept[c]);
            survivors += count_bits(kept[c]);
        }
        if (lane_bits(nan)) continue;
        live[l] = -1;
        pruned_top[l] = hmax(out);
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
            again[c] = lane_bits(in);
            compress_store(packed + survivors, z, again[c]);
            survivors += count_bits(again[c]);
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

// The backward of one row on its support only (packed by vector compaction): w = y ** (2 - alpha),
// grad_x = w g - w sum(w g) / sum(w); with d_alpha, also (Correia et al., 2019, as in the entmax package)
// (sum g y - m) / (a - 1)**2 - (sum g y log y - m sum y log y) / (a - 1), m = sum(w g) / sum(w); 0 for a = 1.
// `packed` holds 3 x width floats and then `chunks` uint32 (width and chunks as AlphaScratch's).
template <typename T>
void alpha_backward_row(const T *g, const T *yr, T *o, float *d_alpha, int64_t n, float a, float *packed,
                        int64_t width) {
    float *py = packed, *pg = packed + width, *pw = packed + 2 * width;
    uint32_t *bits = reinterpret_cast<uint32_t *>(packed + 3 * width);
    const vf zero{};
    int kept = 0;
    for (int64_t i = 0, c = 0; i < n; i += L, ++c) {
        const vf yv = load_chunk(yr, i, n, 0.0f);
        bits[c] = lane_bits(yv > zero);
        compress_store(pg + kept, load_chunk(g, i, n, 0.0f), bits[c]);
        compress_store(py + kept, yv, bits[c]);
        kept += count_bits(bits[c]);
    }
    const vf exponent = splat(2.0f - a), ln2 = splat(0.693147180559945309f);
    vi lane;
    for (int l = 0; l < L; ++l) lane[l] = l;
    vf wgv{}, wv{}, gyv{}, gsv{}, sv{};
    for (int64_t i = 0; i < kept; i += L) {
        const vi inside = lane < int(kept - i);  // the packed entries: all of them have y > 0
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
    const float mean = hsum(wgv) / hsum(wv);
    int used = 0;
    for (int64_t i = 0, c = 0; i < n; i += L, ++c) {
        const vf weight = expand_load(pw + used, bits[c]);
        used += count_bits(bits[c]);
        store_chunk(o, i, n, weight * (load_chunk(g, i, n, 0.0f) - splat(mean)));
    }
    if (d_alpha) {
        const float am1 = a - 1.0f;
        *d_alpha = am1 == 0.0f ? 0.0f  // alpha = 1 is softmax, whose alpha gradient is taken as 0
                               : (hsum(gyv) - mean) / (am1 * am1) - (hsum(gsv) - mean * hsum(sv)) / am1;
    }
}

}  // namespace vitscope
