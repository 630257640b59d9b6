// alpha-entmax's forward on the CPU, one alpha per row in (1, 2], for a block of up to 64 rows. Included by
// sparse_rows.cpp (the backward is alpha_backward.h).
//
// y = [z - tau]_+ ** p / sum, z = (alpha - 1) (x - max), p = 1 / (alpha - 1).
// * Pruning. tau >= -1 (the top key alone has mass 1 there), so only keys with z > -1 can be in the support.
//   Each row is read row-major (vector loads, no transpose), and its survivors are packed (vector compaction).
//   After a first Newton pass, row by row, they are pruned again at its result (a lower bound of tau): on
//   attention-like rows a fifth to a twentieth of the keys are left. A row is accepted only if its final tau is
//   at or above every pruned key.
// * Newton on ||[z - tau]_+||_p - 1 (convex: from below it never overshoots the root), from the lower bound
//   max(-1, mean(z) - k**(-1/p)) over the k survivors (Jensen: their mass alone is at least 1 there). Each pass
//   takes one power per survivor: q = gap**(p - 1), with sum(q gap) and sum(q). A row is done when its step is
//   below 16 float32 ulps of 1 (the eager solver's tolerance). The first two passes step by Halley's rule
//   instead (with sum(q / gap) too: cubic, one pass fewer at alpha <= 1.4); it may pass the root, so pruning
//   uses the Newton iterate, and keys left outside the support by an overshoot join the final check.
// * The later passes run in the lanes: 16 rows transposed to the 16 lanes, each pass as long as the longest of
//   them. The block's rows are sorted by survivors first, so that each 16 are alike: on the bench's rows at
//   alpha 1.3, a pass over 22 survivors per lane instead of 32 (the mean is 18).
// * No separate output pass: that last pass's q give y at tau + step to first order, q (gap - p step), the
//   neglected term being of order step**2 (step <= 2e-6 there); then renormalised, and written back to the
//   rows through the same transposes and a vector expansion.
#pragma once

#include <algorithm>
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
    void fill(float *out, int64_t rows) const {  // rows [0, rows)' alphas, without a division per row
        int64_t within = first % inner, k = first / inner % period;
        for (int64_t r = 0; r < rows; ++r) {
            out[r] = values[k];
            if (++within == inner) {
                within = 0;
                k = k + 1 == period ? 0 : k + 1;
            }
        }
    }
};

constexpr int ALPHA_BLOCK = 64;  // rows per block: 16 were 4-10% slower at alpha 1.3 (less alike), 128 no faster

// One thread's buffers for blocks of ALPHA_BLOCK rows of n keys: `width` is n rounded up to L, plus L of room for
// the whole-vector stores of the compaction.
struct AlphaScratch {
    int64_t width = 0, chunks = 0;
    vf *lanes = nullptr;       // width: 16 rows' survivors' z, one row per lane, then the output
    vf *powers = nullptr;      // width: q = gap ** (p - 1) at the current tau
    float *packed = nullptr;   // (ALPHA_BLOCK + 1) x width: each row's survivors, row-major; the last row is
                               // -inf, for the lanes no row takes
    uint16_t *kept = nullptr;  // which keys of each 16 survived, as bits, 16 per chunk (read 64 at a time): for each
                               // row `words` 64-bit words, zero past its chunks; ALPHA_BLOCK rows of the first
                               // level, then ALPHA_BLOCK of the second (over the first level's survivors)
    int64_t words = 0;

    explicit AlphaScratch(int64_t n)
        : width((n + L - 1) / L * L + L), chunks((n + L - 1) / L), words((chunks + 3) / 4 + 2) {
        lanes = static_cast<vf *>(std::aligned_alloc(sizeof(vf), size_t(width) * sizeof(vf)));
        powers = static_cast<vf *>(std::aligned_alloc(sizeof(vf), size_t(width) * sizeof(vf)));
        packed = static_cast<float *>(
            std::aligned_alloc(sizeof(vf), size_t(width) * (ALPHA_BLOCK + 1) * sizeof(float)));
        kept = static_cast<uint16_t *>(std::malloc(size_t(2 * ALPHA_BLOCK * words) * sizeof(uint64_t)));
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
    float *row(int r) const { return packed + r * width; }
    uint16_t *first_bits(int r) const { return kept + 4 * r * words; }
    uint16_t *second_bits(int r) const { return kept + 4 * (ALPHA_BLOCK + r) * words; }
};

// What the block's rows carry from one stage to the next, one entry per row (arrays, not vectors: inserting per-row
// results into a vector one by one would chain the rows' latencies together)
struct BlockRows {
    alignas(64) float scale[ALPHA_BLOCK], power[ALPHA_BLOCK];  // alpha - 1 and p = 1 / (alpha - 1)
    alignas(64) float count[ALPHA_BLOCK], sum[ALPHA_BLOCK];    // first-level survivors: how many, and their sum
    alignas(64) float tau[ALPHA_BLOCK], pruned[ALPHA_BLOCK];   // lower bound of tau; largest pruned z
    alignas(64) float totals[ALPHA_BLOCK], slopes[ALPHA_BLOCK], curves[ALPHA_BLOCK];
    alignas(64) float start[ALPHA_BLOCK];  // where the passes in the lanes start: the first pass's Halley step
    alignas(64) int32_t live[ALPHA_BLOCK], survivors[ALPHA_BLOCK];  // solved here (-1); second-level survivors
    uint8_t done[ALPHA_BLOCK];                                       // proven exact
};

// Each row: its maximum (and its sum, NaN if it holds a NaN), then its survivors z > -1 packed, with their sum.
// The keys pruned here have z <= -1, at or below the root (it is at least -1): -1 stands for the largest of them
// in the final check. Rows with NaN, +inf or nothing above -inf stay open (live 0): the caller's solver takes them.
template <typename T>
void prune_rows(const T *x, int rows, int64_t n, AlphaScratch &work, BlockRows &b) {
    const float inf = INFINITY;
    const vf zero{}, one = splat(1.0f), ninf = splat(-inf);
    for (int l = 0; l < rows; ++l) {
        if (!b.live[l]) continue;
        const T *xr = x + l * n;
        vf top = ninf, nan_sum{};
        for (int64_t i = 0; i < n; i += L) {
            const vf v = load_chunk(xr, i, n, -inf);
            top = v > top ? v : top;
            nan_sum += v;
            __builtin_prefetch(xr + ALPHA_BLOCK * n + i, 0, 1);  // the same row of the next block
        }
        const float max = hmax(top);
        if (!(max > -inf && max < inf) || lane_bits(nan_sum != nan_sum)) {
            b.live[l] = 0;
            continue;
        }
        float *packed = work.row(l);
        uint16_t *kept = work.first_bits(l);
        const vf m = splat(max), s = splat(b.scale[l]);
        vf total{};
        int survivors = 0;
        for (int64_t i = 0, c = 0; i < n; i += L, ++c) {
            const vf z = s * (load_chunk(xr, i, n, -inf) - m);
            const vi in = z > -one;
            total += in ? z : zero;
            const uint32_t bits = lane_bits(in);  // kept in a register: the vector store below may alias `kept`
            kept[c] = uint16_t(bits);
            compress_store(packed + survivors, z, bits);
            survivors += count_bits(bits);
        }
        for (int64_t c = work.chunks; c < 4 * work.words; ++c) kept[c] = 0;
        b.count[l] = float(survivors);
        b.sum[l] = hsum(total);
    }
}

// Halley's step from Newton's on ||[z - tau]_+||_p - 1, with total, slope and curve the sums of gap**p,
// gap**(p - 1) and gap**(p - 2) over the support: newton / (1 - newton (p - 1) (curve / slope - slope / total) / 2).
// Its divisor is kept at 1/2 or more (at most twice Newton's step; an overflowed curve, NaN, gives that too).
// Cubic where Newton is quadratic: on the bench's rows at alpha 1.3, from the first pass's start every row is done
// after three passes instead of four.
inline vf halley(vf newton, vf total, vf slope, vf curve, vf power_m1) {
    const vf half = splat(0.5f);
    const vf divisor = splat(1.0f) - newton * power_m1 * (curve / slope - slope / total) * half;
    return newton / (divisor > half ? divisor : half);
}

// One pass in the lanes at tau: q = gap**(p - 1) to `powers`, and the sums of gap**p and q (with `curved`, also of
// gap**(p - 2), for Halley's step) over the support
template <bool curved>
inline void lane_pass(const vf *lanes, vf *powers, int64_t most, vf tau, vf power_m1, vf &total, vf &slope,
                      vf &curve) {
    const vf zero{};
    for (int64_t i = 0; i < most; ++i) {
        const vf gap = lanes[i] - tau;
        const vf q = vpow_gap(gap, power_m1);
        const vi in = gap > zero;
        powers[i] = q;
        total += q * (in ? gap : zero);
        slope += q;
        if constexpr (curved) curve += in ? q * vrcp(gap) : zero;
    }
}

// The first Newton pass, row by row on the packed survivors, from the lower bound mean(z) - k**(-1/p) over the k
// survivors (Jensen: their mass alone is 1 there), or -1; its result, a tighter lower bound, to b.tau
inline void first_pass(int rows, AlphaScratch &work, BlockRows &b) {
    const vf one = splat(1.0f), zero{}, ninf = splat(-INFINITY);
    for (int g = 0; g < ALPHA_BLOCK; g += L) {
        const vf count = load16(b.count + g), scale = load16(b.scale + g);
        vf tau = load16(b.sum + g) / count - vexp2(-scale * vlog2(count));
        tau = tau > -one ? tau : -one;
        std::memcpy(b.tau + g, &tau, sizeof tau);
    }
    vi lane;
    for (int l = 0; l < L; ++l) lane[l] = l;
    for (int l = 0; l < rows; ++l) {
        if (!b.live[l]) continue;
        const float *packed = work.row(l);
        const vf t = splat(b.tau[l]), e = splat(b.power[l] - 1.0f);
        const int count = int(b.count[l]);
        vf total{}, slope{}, curve{};
        for (int64_t i = 0; i < count; i += L) {
            const vf gap = (lane < int(count - i) ? load16(packed + i) : ninf) - t;
            const vf q = vpow_gap(gap, e);
            const vi in = gap > zero;
            total += q * (in ? gap : zero);
            slope += q;
            curve += in ? q * vrcp(gap) : zero;
        }
        b.totals[l] = hsum(total);
        b.slopes[l] = hsum(slope);
        b.curves[l] = hsum(curve);
    }
    for (int g = 0; g < ALPHA_BLOCK; g += L) {
        const vf totals = load16(b.totals + g), slopes = load16(b.slopes + g), scale = load16(b.scale + g);
        const vf tau = load16(b.tau + g), newton = (totals - vexp2((one - scale) * vlog2(totals))) / slopes;
        const vi live = load16i(b.live + g);
        const vf bound = live ? tau + newton : tau;  // Newton from below: still a lower bound, to prune at
        const vf start = live ? tau + halley(newton, totals, slopes, load16(b.curves + g),
                                             load16(b.power + g) - one) : tau;
        std::memcpy(b.tau + g, &bound, sizeof bound);
        std::memcpy(b.start + g, &start, sizeof start);
    }
}

// Each row's survivors pruned again at b.tau, in place: the second level, with its bits over the first level's
inline void prune_again(int rows, AlphaScratch &work, BlockRows &b) {
    const vf ninf = splat(-INFINITY);
    vi lane;
    for (int l = 0; l < L; ++l) lane[l] = l;
    for (int l = 0; l < rows; ++l) {
        if (!b.live[l]) continue;
        float *packed = work.row(l);
        uint16_t *again = work.second_bits(l);
        const vf t = splat(b.tau[l]);
        const int count = int(b.count[l]);
        vf out = ninf;
        int survivors = 0;
        int64_t c = 0;
        for (int64_t i = 0; i < count; i += L, ++c) {
            const vf z = lane < int(count - i) ? load16(packed + i) : ninf;
            const vi in = z > t;
            out = in ? out : (z > out ? z : out);
            const uint32_t bits = lane_bits(in);
            again[c] = uint16_t(bits);
            compress_store(packed + survivors, z, bits);
            survivors += count_bits(bits);
        }
        for (; c < 4 * work.words; ++c) again[c] = 0;  // read past the last chunk's bits, as zeros
        const float pruned = hmax(out);
        b.pruned[l] = pruned > -1.0f ? pruned : -1.0f;
        b.survivors[l] = survivors;
    }
}

// The Newton passes for 16 rows (`members` of them: row numbers in the block, the other lanes idle) in the lanes,
// then their normalised output back in place of their packed survivors; b.done says which are proven exact
inline void solve_in_lanes(const int *members_of, int members, int max_iter, AlphaScratch &work, BlockRows &b) {
    const float tol = 16.0f * 1.1920929e-7f;
    const vf zero{}, one = splat(1.0f), ninf = splat(-INFINITY);
    float *row_of[L];
    vf tau, scale, power, pruned_top;
    vi live{};
    int most = 0;
    for (int l = 0; l < L; ++l) {
        const int r = l < members ? members_of[l] : -1;
        row_of[l] = r >= 0 ? work.row(r) : work.row(ALPHA_BLOCK);
        tau[l] = r >= 0 ? b.start[r] : 0.0f;
        scale[l] = r >= 0 ? b.scale[r] : 0.5f;
        power[l] = r >= 0 ? b.power[r] : 2.0f;
        pruned_top[l] = r >= 0 ? b.pruned[r] : -1.0f;
        live[l] = r >= 0 ? -1 : 0;
        if (r >= 0 && b.survivors[r] > most) most = b.survivors[r];
    }
    const vf power_m1 = power - one;

    // The survivors to the lanes (16 x 16 transposes), -inf past each row's end
    const int64_t span = (most + L - 1) / L * L;  // whole tiles
    for (int l = 0; l < L; ++l) {  // whole vectors: packed has L floats of room past any span
        for (int64_t i = l < members ? b.survivors[members_of[l]] : 0; i < span; i += L)
            std::memcpy(row_of[l] + i, &ninf, sizeof(vf));
    }
    vf *lanes = work.lanes, *powers = work.powers;
    for (int64_t i0 = 0; i0 < span; i0 += L) {
        vf t[L];
        for (int l = 0; l < L; ++l) t[l] = load16(row_of[l] + i0);
        transpose16(t);
        for (int c = 0; c < L; ++c) lanes[i0 + c] = t[c];
    }

    vf step{};
    vi passes{};
    for (int pass = 2; pass <= max_iter && most > 0; ++pass) {
        vf total{}, slope{}, curve{};  // sums of gap**p, gap**(p - 1) (and gap**(p - 2)) over the support
        if (pass == 2)
            lane_pass<true>(lanes, powers, most, tau, power_m1, total, slope, curve);
        else
            lane_pass<false>(lanes, powers, most, tau, power_m1, total, slope, curve);
        const vf norm_term = vexp2((one - scale) * vlog2(total));  // total ** (1 - 1/p)
        const vf next = (total - norm_term) / slope;
        const vi open = live & (passes == 0);
        const vi small = (next <= splat(tol)) & (next >= splat(-tol));
        step = open ? next : step;
        passes = (open & small) ? vi{} + pass : passes;
        tau = (open & ~small) ? tau + (pass == 2 ? halley(next, total, slope, curve, power_m1) : next) : tau;
        bool left = false;
        for (int l = 0; l < members; ++l) left |= passes[l] == 0;
        if (!left) break;
    }
    // Halley's steps can pass the root: then the last step is negative, and a survivor just outside the support
    // at tau may be inside it at tau + step; the largest such key joins the pruned ones in the check
    for (int64_t i = 0; i < most; ++i) pruned_top = lanes[i] <= tau && lanes[i] > pruned_top ? lanes[i] : pruned_top;
    passes = (pruned_top <= tau + step) ? passes : vi{};  // a pruned key would be in the support: not exact

    // y at tau + step from the last pass's powers, renormalised, back through the transposes
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
        for (int l = 0; l < L; ++l) std::memcpy(row_of[l] + i0, &t[l], sizeof(vf));
    }
    for (int l = 0; l < members; ++l) b.done[members_of[l]] = passes[l] > 0;
}

// The forward of up to ALPHA_BLOCK rows: y and ok (proven exact) for each; rows not proven are left to the caller
template <typename T>
void solve_alpha_block(const T *x, T *y, uint8_t *ok, int rows, int64_t n, int max_iter, AlphaScratch &work,
                       Alphas alpha) {
    BlockRows b;
    float alphas[ALPHA_BLOCK];
    alpha.fill(alphas, rows);
    for (int l = 0; l < ALPHA_BLOCK; ++l) {
        const float a = l < rows ? alphas[l] : 2.0f;
        const bool valid = a > 1.0f && a <= 2.0f;  // else the caller's solver decides
        b.scale[l] = valid ? a - 1.0f : 0.5f;
        b.power[l] = 1.0f / b.scale[l];
        b.live[l] = valid && l < rows ? -1 : 0;
        b.count[l] = 1.0f;
        b.sum[l] = 0.0f;
        b.totals[l] = b.slopes[l] = 1.0f;
        b.curves[l] = 0.0f;
        b.survivors[l] = 0;
        b.done[l] = 0;
    }
    prune_rows(x, rows, n, work, b);
    first_pass(rows, work, b);
    prune_again(rows, work, b);

    // the live rows by survivors, then 16 at a time through the lanes
    int order[ALPHA_BLOCK], live_rows = 0;
    for (int l = 0; l < rows; ++l)
        if (b.live[l]) order[live_rows++] = l;
    std::sort(order, order + live_rows, [&](int i, int j) { return b.survivors[i] < b.survivors[j]; });
    for (int g = 0; g < live_rows; g += L)
        solve_in_lanes(order + g, live_rows - g < L ? live_rows - g : L, max_iter, work, b);

    // each proven row back through the two levels of expansion
    for (int l = 0; l < rows; ++l) {
        ok[l] = b.done[l];
        if (!ok[l]) continue;  // the caller's solver writes this row
        const float *packed = work.row(l);
        const uint16_t *kept = work.first_bits(l), *again = work.second_bits(l);
        T *yr = y + l * n;
        int first = 0, used = 0;  // entries of the first level and of the second seen so far
        uint64_t row_bits = 0;    // the support's bits for 4 chunks (64 keys) of the row
        for (int64_t i = 0, c = 0; i < n; i += L, ++c) {
            if ((c & 3) == 0) {  // the second level's bits for these 64 keys' first-level survivors, put in place
                const uint64_t mask = bits64(kept + c);
                const int count = count_bits64(mask), shift = first & 63;
                const uint16_t *at = again + 4 * (first >> 6);
                const uint64_t window = shift ? bits64(at) >> shift | bits64(at + 4) << (64 - shift) : bits64(at);
                row_bits = deposit_bits64(count == 64 ? window : window & ((uint64_t(1) << count) - 1), mask);
                first += count;
            }
            const uint32_t bits = uint32_t(row_bits >> (16 * (c & 3))) & 0xffffu;
            store_chunk(yr, i, n, expand_load(packed + used, bits));
            used += count_bits(bits);
        }
    }
}

}  // namespace vitscope
