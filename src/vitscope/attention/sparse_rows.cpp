// Exact sparsemax, entmax-1.5 and alpha-entmax (per-row alpha in (1, 2]) on the CPU: forward, and the
// closed-form backward (with the gradient with respect to alpha). Rows are float32 or bfloat16, and so are the
// outputs (converted as they are loaded and stored: no separate conversion pass; the arithmetic is float32).
//
// Built at first use by vitscope/attention/native.py (c++ -O3 -march=native) and called through ctypes.
// Same algorithm as the readable solvers in normalizers.py, laid out for a CPU:
//
// * 16 rows at a time, one row per vector lane. The rows are transposed (16 x 16 tiles, in registers) into a
//   buffer of n x 16 floats that stays in L1/L2, so every threshold iteration is a vertical pass with no
//   horizontal reductions and no tail handling, and the scalar steps (sqrt, division) run for 16 rows at once.
// * Threshold tau on z = scale * (x - max) (shift first: a large common offset costs no digits): start at the lower bound max(-1, mean(z) - n**(-1/p)); per pass,
//   sums over the support {z > tau} give the closed-form root on that support, which is the exact threshold iff
//   it keeps exactly that support; otherwise step from below (Newton for entmax-1.5, Michelot for sparsemax).
// * ok[row] is 1 when the row provably converged within max_iter passes, else 0 (NaN input, say): the caller
//   finishes those rows with its exact eager solver.
// * While a block iterates, the next block is prefetched, so memory traffic overlaps the arithmetic.
// * alpha-entmax prunes each row to the keys that can be in its support first, in blocks of 64 rows sorted by
//   what is left: alpha_rows.h (forward) and alpha_backward.h.
//
// Output y = [z - tau]_+ ** (1 / (alpha - 1)) for each row; x and y are row-major (rows x n).

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "alpha_backward.h"
#include "alpha_rows.h"
#include "parallel.h"
#include "row_tiles.h"
#include "vector_math.h"

namespace {

using namespace vitscope;

// the kinds and their codes, from the table Python reads too
#define VITSCOPE_KIND(name, code, alpha) KIND_##name = code,
enum Kind {
#include "kinds.def"
};
#undef VITSCOPE_KIND
constexpr Kind SPARSEMAX = KIND_sparsemax, ENTMAX15 = KIND_entmax15, ALPHA = KIND_alpha;

// Rows per chunk handed to a thread (a multiple of the 16-row blocks and of alpha-entmax's 64-row ones): small
// enough that the threads finish together when rows differ in cost or a thread is preempted, large enough (about
// 0.8 MB of 197-key float32 rows) that each thread still streams long runs of memory (64-row chunks measured 10-40%
// slower than static halves)
constexpr int64_t CHUNK_ROWS = 64 * L;

template <Kind kind, typename T>
void solve_block(const T *x, T *y, uint8_t *ok, int rows, int64_t n, int max_iter, vf *buf) {
    const float scale = kind == ENTMAX15 ? 0.5f : 1.0f;
    const vf zero{}, one = splat(1.0f), inf = splat(INFINITY);
    const BlockStats stats = load_block(x, rows, n, splat(scale), buf);
    const vf max = stats.max;

    // lower bound on tau: mean(z) - k**(-1/p) over the k finite keys, with p = 2 (entmax-1.5) or 1 (sparsemax),
    // and -1
    vf offset;
    for (int l = 0; l < L; ++l)
        offset[l] = kind == ENTMAX15 ? 1.0f / std::sqrt(stats.count[l]) : 1.0f / stats.count[l];
    vf tau = stats.sum / stats.count - offset;
    tau = tau > -one ? tau : -one;
    vf threshold = tau;
    // rows with a NaN, a +inf or nothing above -inf stay open (passes 0): the caller's solver decides those
    const vi live = stats.live;
    vi passes{};

    for (int pass = 1; pass <= max_iter; ++pass) {
        // One pass over the block at the current tau: over the support {z > tau} the count k, the sum s1 and
        // (entmax-1.5) the sum of squares s2 of the gaps z - tau, the smallest gap; outside it the largest gap.
        vf s1{}, s2{}, k{}, low = inf, high = -inf, s1b{}, s2b{}, kb{}, lowb = inf, highb = -inf;  // two sets
        int64_t i = 0;
        for (; i + 1 < n; i += 2) {
            const vf u = buf[i], w = buf[i + 1];
            const vi uin = u > tau, win = w > tau;
            const vf uv = u - tau, wv = w - tau;
            const vf up = uin ? uv : zero, wp = win ? wv : zero;
            s1 += up; s1b += wp;
            k += uin ? one : zero; kb += win ? one : zero;
            if (kind == ENTMAX15) { s2 += up * up; s2b += wp * wp; }
            const vf ul = uin ? uv : inf, wl = win ? wv : inf, uh = uin ? -inf : uv, wh = win ? -inf : wv;
            low = ul < low ? ul : low;
            lowb = wl < lowb ? wl : lowb;
            high = uh > high ? uh : high;
            highb = wh > highb ? wh : highb;
        }
        for (; i < n; ++i) {
            const vf u = buf[i];
            const vi uin = u > tau;
            const vf uv = u - tau;
            const vf up = uin ? uv : zero;
            s1 += up;
            k += uin ? one : zero;
            if (kind == ENTMAX15) s2 += up * up;
            const vf ul = uin ? uv : inf, uh = uin ? -inf : uv;
            low = ul < low ? ul : low;
            high = uh > high ? uh : high;
        }
        s1 += s1b; s2 += s2b; k += kb;
        low = lowb < low ? lowb : low;
        high = highb > high ? highb : high;

        // The root of the problem on the support of tau, relative to tau, in closed form. Its rounding error
        // grows with the sums, so where tau started far below it, take one more pass from just below the root
        // (the sums are then small) rather than accept it. From below, steps never overshoot: Newton's for
        // entmax-1.5, Michelot's (the root itself) for sparsemax.
        vf root, step;
        vi accurate;
        if (kind == ENTMAX15) {  // smaller root of k r^2 - 2 s1 r + s2 - 1 = 0, in a form without cancellation
            const vf disc = s1 * s1 - k * (s2 - one);
            root = (s2 - one) / (s1 + vsqrt(disc > zero ? disc : zero));
            accurate = root * (disc + s1 * s1) <= splat(0.25f) * disc;  // the discriminant keeps its digits
            step = (s2 - vsqrt(s2)) / s1;                                 // Newton on ||[z - tau]_+||_2 - 1
        } else {                 // k r = s1 - 1
            root = (s1 - one) / k;
            accurate = s1 <= splat(2.0f);  // the sum of gaps is at most twice its target, 1
            step = root;
        }
        // exact iff the root keeps exactly that support: everything in it above the root, nothing outside
        const vi kept = (low > root) & (high <= root);
        step = kept ? root * splat(1.0f - 1.0f / 1024.0f) : step;
        const vi converged = kept & accurate;
        const vi open = live & (passes == 0);
        threshold = open ? tau + root : threshold;
        passes = (open & converged) ? vi{} + pass : passes;
        tau = (open & ~converged) ? tau + step : tau;
        bool left = false;
        for (int l = 0; l < rows; ++l) left |= passes[l] == 0;
        if (!left) break;
    }

    for (int l = 0; l < rows; ++l) {
        const T *xr = x + l * n;
        T *yr = y + l * n;
        const vf top = splat(max[l]), c = splat(threshold[l]), s = splat(scale);
        for (int64_t i = 0; i < n; i += L) {
            vf g = s * (load_chunk(xr, i, n, 0.0f) - top) - c;
            g = g > zero ? g : zero;
            store_chunk(yr, i, n, kind == ENTMAX15 ? g * g : g);
        }
        ok[l] = passes[l] > 0;
    }
}

// The rows of the chunks this thread takes, 16 at a time (alpha-entmax: ALPHA_BLOCK at a time), with one scratch
// buffer for all of them
template <Kind kind, typename T>
void solve_rows(const T *x, T *y, uint8_t *ok, RowChunks &chunks, int64_t n, int max_iter, Alphas alpha) {
    if constexpr (kind == ALPHA) {
        AlphaScratch work(n);
        if (!work.ok()) return;  // ok stays 0: the caller's exact solver takes these rows
        for (int64_t first, last; chunks.next(first, last);) {
            for (int64_t r = first; r < last; r += ALPHA_BLOCK) {
                const int rows = last - r < ALPHA_BLOCK ? int(last - r) : ALPHA_BLOCK;
                solve_alpha_block(x + r * n, y + r * n, ok + r, rows, n, max_iter, work, alpha.from(r));
            }
        }
        return;
    }
    vf *buf = static_cast<vf *>(std::aligned_alloc(sizeof(vf), size_t(n) * sizeof(vf)));
    if (!buf) return;  // ok stays 0: the caller's exact solver takes these rows
    for (int64_t first, last; chunks.next(first, last);) {
        for (int64_t r = first; r < last; r += L) {
            const int rows = last - r < L ? int(last - r) : L;
            solve_block<kind>(x + r * n, y + r * n, ok + r, rows, n, max_iter, buf);
        }
    }
    std::free(buf);
}

// Closed-form backward on the rows of the chunks this thread takes: grad_x = w g - w sum(w g) / sum(w), with
// w = y ** (2 - alpha) on the support (sqrt(y) for entmax-1.5, the support's indicator for sparsemax). One row
// at a time: rows are independent. The weights go to `packed` in the first pass and are reused in the second,
// the row still in L1. alpha-entmax (and its alpha gradient) works on each row's support only:
// alpha_backward_rows, BACKWARD_ROWS rows at a time. Returns false where its buffer cannot be had.
template <Kind kind, typename T>
bool backward_rows(const T *grad, const T *y, T *out, float *d_alpha, RowChunks &chunks, int64_t n,
                   Alphas alpha) {
    constexpr int G = BACKWARD_ROWS;
    const int64_t width = (n + L - 1) / L * L + L, row_chunks = (n + L - 1) / L;
    float *packed = static_cast<float *>(std::aligned_alloc(sizeof(vf), size_t(G * (3 * width + row_chunks)) * 4));
    if (!packed) return false;
    for (int64_t first, last; chunks.next(first, last);) {
        if constexpr (kind == ALPHA) {
            float alphas[CHUNK_ROWS];  // the rows' alphas, CHUNK_ROWS at a time
            for (int64_t start = first; start < last; start += CHUNK_ROWS) {
                const int64_t end = last - start < CHUNK_ROWS ? last : start + CHUNK_ROWS;
                alpha.from(start).fill(alphas, end - start);
                int64_t r = start;
                for (; r + G <= end; r += G)
                    alpha_backward_rows<G>(grad + r * n, y + r * n, out + r * n, d_alpha ? d_alpha + r : nullptr,
                                           n, alphas + (r - start), packed, width);
                for (; r < end; ++r)
                    alpha_backward_rows<1>(grad + r * n, y + r * n, out + r * n, d_alpha ? d_alpha + r : nullptr,
                                           n, alphas + (r - start), packed, width);
            }
        } else {  // the weights in float32 in `packed`, reused while the row is still in L1
            for (int64_t r = first; r < last; ++r) {
                const T *g = grad + r * n, *yr = y + r * n;
                T *o = out + r * n;
                vf wg{}, w{};
                for (int64_t i = 0; i < n; i += L) {
                    const vf yv = load_chunk(yr, i, n, 0.0f);
                    const vf wi = kind == ENTMAX15 ? vsqrt(yv) : (yv > vf{} ? splat(1.0f) : vf{});
                    store16(packed + i, wi);
                    wg += wi * load_chunk(g, i, n, 0.0f);
                    w += wi;
                }
                const vf mean = splat(hsum(wg) / hsum(w));
                for (int64_t i = 0; i < n; i += L)
                    store_chunk(o, i, n, load16(packed + i) * (load_chunk(g, i, n, 0.0f) - mean));
            }
        }
    }
    std::free(packed);
    return true;
}

template <Kind kind, typename T>
void forward(const T *x, T *y, uint8_t *ok, int64_t rows, int64_t n, int threads, int max_iter,
             Alphas alpha) {
    std::memset(ok, 0, size_t(rows));
    in_parallel(rows, CHUNK_ROWS, threads, [&](RowChunks &chunks) {
        solve_rows<kind>(x, y, ok, chunks, n, max_iter, alpha);
    });
}

// d_alpha: one value per alpha value (alpha.period of them), each the sum over the rows that share it (the
// gradient of a per-head alpha, say), summed in double after the rows' own values; 0 for alpha = 1
template <Kind kind, typename T>
int backward(const T *grad, const T *y, T *out, float *d_alpha, int64_t rows, int64_t n, int threads,
              Alphas alpha) {
    const bool shared = d_alpha && !(alpha.inner == 1 && alpha.period == rows);  // else one per row already
    float *row_d = shared ? static_cast<float *>(std::malloc(size_t(rows) * sizeof(float))) : d_alpha;
    if (shared && !row_d) return -3;
    int failed = 0;
    in_parallel(rows, CHUNK_ROWS, threads, [&](RowChunks &chunks) {
        if (!backward_rows<kind>(grad, y, out, row_d, chunks, n, alpha)) __atomic_store_n(&failed, 1, 0);
    });
    if (shared) {
        double *sums = static_cast<double *>(std::calloc(size_t(alpha.period), sizeof(double)));
        if (sums) {
            for (int64_t r = 0; r < rows; ++r) sums[alpha.index(r)] += row_d[r];
            for (int64_t k = 0; k < alpha.period; ++k) d_alpha[k] = float(sums[k]);
        }
        std::free(sums);
        std::free(row_d);
        failed |= !sums;
    }
    return failed ? -3 : 0;
}

template <Kind kind>
int forward_typed(int dtype, const void *x, void *y, uint8_t *ok, int64_t rows, int64_t n, int threads,
                  int max_iter, Alphas alpha) {
    switch (dtype) {
        case F32:
            forward<kind>(static_cast<const float *>(x), static_cast<float *>(y), ok, rows, n, threads, max_iter, alpha);
            return 0;
        case BF16:
            forward<kind>(static_cast<const uint16_t *>(x), static_cast<uint16_t *>(y), ok, rows, n, threads, max_iter,
                          alpha);
            return 0;
        default: return -2;
    }
}

template <Kind kind>
int backward_typed(int dtype, const void *grad, const void *y, void *out, float *d_alpha, int64_t rows, int64_t n,
                   int threads, Alphas alpha) {
    switch (dtype) {
        case F32:
            return backward<kind>(static_cast<const float *>(grad), static_cast<const float *>(y),
                                  static_cast<float *>(out), d_alpha, rows, n, threads, alpha);
        case BF16:
            return backward<kind>(static_cast<const uint16_t *>(grad), static_cast<const uint16_t *>(y),
                                  static_cast<uint16_t *>(out), d_alpha, rows, n, threads, alpha);
        default: return -2;
    }
}

}  // namespace

extern "C" {

int vitscope_abi_version() { return 8; }

// kind: a code of kinds.def; dtype: 0 float32, 1 bfloat16, of x and y; row r's alpha is
// alpha_values[r / alpha_inner % alpha_period] (kind alpha only, else ignored and may be null; 1, 1: one alpha for
// all rows); ok: one byte per row, 1 where the row is proven exact, else 0 (a bool array). Returns 0, -1 for an
// unknown kind, -2 for an unknown dtype.
int vitscope_forward(int kind, int dtype, const float *alpha_values, int64_t alpha_inner, int64_t alpha_period,
                     const void *x, void *y, uint8_t *ok, int64_t rows, int64_t n, int threads, int max_iter) {
    const Alphas alpha{alpha_values, alpha_inner, alpha_period};
    switch (kind) {
        case SPARSEMAX: return forward_typed<SPARSEMAX>(dtype, x, y, ok, rows, n, threads, max_iter, alpha);
        case ENTMAX15: return forward_typed<ENTMAX15>(dtype, x, y, ok, rows, n, threads, max_iter, alpha);
        case ALPHA: return forward_typed<ALPHA>(dtype, x, y, ok, rows, n, threads, max_iter, alpha);
        default: return -1;
    }
}

// grad, y -> out, all of dtype as above; alpha as above; d_alpha (float32, kind alpha only; may be null): the
// gradient with respect to each alpha value (alpha_period of them, each summed over the rows that share it).
// Returns 0, -1 or -2 as above, -3 when a work buffer could not be allocated (out is then incomplete).
int vitscope_backward(int kind, int dtype, const float *alpha_values, int64_t alpha_inner, int64_t alpha_period,
                      const void *grad, const void *y, void *out, float *d_alpha, int64_t rows, int64_t n,
                      int threads) {
    const Alphas alpha{alpha_values, alpha_inner, alpha_period};
    switch (kind) {
        case SPARSEMAX: return backward_typed<SPARSEMAX>(dtype, grad, y, out, nullptr, rows, n, threads, alpha);
        case ENTMAX15: return backward_typed<ENTMAX15>(dtype, grad, y, out, nullptr, rows, n, threads, alpha);
        case ALPHA: return backward_typed<ALPHA>(dtype, grad, y, out, d_alpha, rows, n, threads, alpha);
        default: return -1;
    }
}

}  // extern "C"
