// Exact sparsemax, entmax-1.5 and alpha-entmax (per-row alpha in (1, 2]) on the CPU: forward, and the
// closed-form backward (with the gradient with respect to alpha). Rows are float32 or bfloat16 (converted as they
// are loaded: no separate conversion pass); outputs are float32.
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
// * ok[row] is the number of passes the row needed, 0 when it did not provably converge within max_iter (NaN
//   input, say): the caller finishes those rows with its exact eager solver.
// * While a block iterates, the next block is prefetched, so memory traffic overlaps the arithmetic.
//
// Output y = [z - tau]_+ ** (1 / (alpha - 1)) for each row; x and y are row-major (rows x n).

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>

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

template <Kind kind, typename T>
void solve_block(const T *x, float *y, uint8_t *ok, int rows, int64_t n, int max_iter, vf *buf) {
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
        float *yr = y + l * n;
        const float top = max[l], c = threshold[l];
        for (int64_t i = 0; i < n; ++i) {
            const float g = scale * (to_float(xr[i]) - top) - c;
            yr[i] = g > 0.0f ? (kind == ENTMAX15 ? g * g : g) : 0.0f;
        }
        ok[l] = uint8_t(passes[l] > 255 ? 255 : passes[l]);
    }
}

// alpha-entmax, one alpha per row in (1, 2]: Newton on ||[z - tau]_+||_p - 1 with p = 1 / (alpha - 1), from the
// same lower bound; convex and nearly linear, so it converges in a handful of passes. A row is done when its
// Newton step falls below 16 float32 ulps of 1 (the eager solver's tolerance); the output is renormalised.
// Rows whose alpha lies outside (1, 2] stay open (ok 0) for the caller's solver.
template <typename T>
void solve_alpha_block(const T *x, float *y, uint8_t *ok, int rows, int64_t n, int max_iter, vf *buf,
                       const float *alpha) {
    const float tol = 16.0f * 1.1920929e-7f;
    const vf zero{}, one = splat(1.0f);
    vf a;
    for (int l = 0; l < L; ++l) a[l] = alpha[l < rows ? l : 0];
    const vi valid = (a > one) & (a <= splat(2.0f));
    const vf scale = valid ? a - one : splat(0.5f), power = one / scale, power_m1 = power - one;
    const BlockStats stats = load_block(x, rows, n, scale, buf);
    vf offset;  // k**(-1/p) over the k finite keys
    for (int l = 0; l < L; ++l) offset[l] = std::pow(stats.count[l], -scale[l]);
    vf tau = stats.sum / stats.count - offset;  // mean(z) - k**(-1/p)
    tau = tau > -one ? tau : -one;
    const vi live = valid & stats.live;
    vi passes{};

    for (int pass = 1; pass <= max_iter; ++pass) {
        vf total{}, slope{};  // sum of gap**p and of gap**(p - 1) over the support
        for (int64_t i = 0; i < n; ++i) {
            const vf gap = buf[i] - tau;
            const vf h = vpow_gap(gap, power_m1);
            total += h * (gap > zero ? gap : zero);
            slope += h;
        }
        const vf norm_term = vexp((one - scale) * vlog(total));  // total ** (1 - 1/p)
        const vf step = (total - norm_term) / slope;
        const vi open = live & (passes == 0);
        tau = open ? tau + step : tau;
        const vi small = (step <= splat(tol)) & (step >= splat(-tol));
        passes = (open & small) ? vi{} + pass : passes;
        bool left = false;
        for (int l = 0; l < rows; ++l) left |= passes[l] == 0 && live[l];
        if (!left) break;
    }

    // y = gap**p / sum(gap**p), computed in the buffer, written back through the same 16 x 16 transposes
    vf total{};
    for (int64_t i = 0; i < n; ++i) {
        buf[i] = vpow_gap(buf[i] - tau, power);
        total += buf[i];
    }
    const vf inverse = one / total;
    int64_t i0 = 0;
    for (; i0 + L <= n; i0 += L) {
        vf t[L];
        for (int c = 0; c < L; ++c) t[c] = buf[i0 + c] * inverse;
        transpose16(t);
        for (int l = 0; l < rows; ++l) std::memcpy(y + l * n + i0, &t[l], sizeof(vf));
    }
    for (int64_t i = i0; i < n; ++i)
        for (int l = 0; l < rows; ++l) y[l * n + i] = buf[i][l] * inverse[l];
    for (int l = 0; l < rows; ++l) ok[l] = uint8_t(passes[l] > 255 ? 255 : passes[l]);
}

template <Kind kind, typename T>
void solve_rows(const T *x, float *y, uint8_t *ok, int64_t first, int64_t last, int64_t n, int max_iter,
                const float *alpha) {
    vf *buf = static_cast<vf *>(std::aligned_alloc(sizeof(vf), size_t(n) * sizeof(vf)));
    if (!buf) return;  // ok stays 0: the caller's exact solver takes these rows
    for (int64_t r = first; r < last; r += L) {
        const int rows = last - r < L ? int(last - r) : L;
        if constexpr (kind == ALPHA) solve_alpha_block(x + r * n, y + r * n, ok + r, rows, n, max_iter, buf, alpha + r);
        else solve_block<kind>(x + r * n, y + r * n, ok + r, rows, n, max_iter, buf);
    }
    std::free(buf);
}

// Closed-form backward on rows [first, last): grad_x = w g - w sum(w g) / sum(w), with w = y ** (2 - alpha) on
// the support (sqrt(y) for entmax-1.5, the support's indicator for sparsemax). One row at a time: rows are
// independent. The weights go to `out` in the first pass and are reused in the second, the row still in L1.
// With d_alpha (kind ALPHA only), also the gradient with respect to each row's alpha (Correia et al., 2019, as in
// the entmax package): (sum g y - m) / (a - 1)**2 - (sum g y log y - m sum y log y) / (a - 1), m = sum(w g) / sum(w).
template <Kind kind, typename T>
void backward_rows(const T *grad, const float *y, float *out, float *d_alpha, int64_t first, int64_t last,
                   int64_t n, const float *alpha) {
    for (int64_t r = first; r < last; ++r) {
        const T *g = grad + r * n;
        const float *yr = y + r * n;
        float *o = out + r * n;
        float wg = 0.0f, w = 0.0f;
        if constexpr (kind != ALPHA) {
            #pragma omp simd reduction(+ : wg, w)
            for (int64_t i = 0; i < n; ++i) {
                const float wi = kind == ENTMAX15 ? std::sqrt(yr[i]) : (yr[i] > 0.0f ? 1.0f : 0.0f);
                const float gi = to_float(g[i]);
                o[i] = wi;
                wg += wi * gi;
                w += wi;
            }
            const float mean = wg / w;
            #pragma omp simd
            for (int64_t i = 0; i < n; ++i) o[i] *= to_float(g[i]) - mean;
        } else {  // the power needs the vector exp/log: 16 entries per step, the tail zero-padded
            const float a = alpha[r];
            const vf zero{}, exponent = splat(2.0f - a);
            vf wgv{}, wv{}, gyv{}, gsv{}, sv{};
            for (int64_t i = 0; i < n; i += L) {
                const int width = n - i < L ? int(n - i) : L;
                vf yv{}, gv{};
                for (int l = 0; l < width; ++l) { yv[l] = yr[i + l]; gv[l] = to_float(g[i + l]); }
                const vi inside = yv > zero;
                const vf logy = vlog(inside ? yv : splat(1.0f));
                const vf weight = inside ? vexp(exponent * logy) : zero;
                wgv += weight * gv;
                wv += weight;
                if (d_alpha) {
                    const vf ylogy = inside ? yv * logy : zero;
                    gyv += gv * yv;
                    gsv += gv * ylogy;
                    sv += ylogy;
                }
                for (int l = 0; l < width; ++l) o[i + l] = weight[l];
            }
            wg = hsum(wgv);
            w = hsum(wv);
            const float mean = wg / w;
            #pragma omp simd
            for (int64_t i = 0; i < n; ++i) o[i] *= to_float(g[i]) - mean;
            if (d_alpha) {
                const float am1 = a - 1.0f;
                d_alpha[r] = (hsum(gyv) - mean) / (am1 * am1) - (hsum(gsv) - mean * hsum(sv)) / am1;
            }
        }
    }
}

template <Kind kind, typename T>
void forward(const T *x, float *y, uint8_t *ok, int64_t rows, int64_t n, int threads, int max_iter,
             const float *alpha) {
    std::memset(ok, 0, size_t(rows));
    in_parallel(rows, L, threads, [&](int64_t first, int64_t last) {
        solve_rows<kind>(x, y, ok, first, last, n, max_iter, alpha);
    });
}

template <Kind kind, typename T>
void backward(const T *grad, const float *y, float *out, float *d_alpha, int64_t rows, int64_t n, int threads,
              const float *alpha) {
    in_parallel(rows, 1, threads, [&](int64_t first, int64_t last) {
        backward_rows<kind>(grad, y, out, d_alpha, first, last, n, alpha);
    });
}

template <Kind kind>
int forward_typed(int dtype, const void *x, float *y, uint8_t *ok, int64_t rows, int64_t n, int threads,
                  int max_iter, const float *alpha) {
    switch (dtype) {
        case F32: forward<kind>(static_cast<const float *>(x), y, ok, rows, n, threads, max_iter, alpha); return 0;
        case BF16: forward<kind>(static_cast<const uint16_t *>(x), y, ok, rows, n, threads, max_iter, alpha); return 0;
        default: return -2;
    }
}

template <Kind kind>
int backward_typed(int dtype, const void *grad, const float *y, float *out, float *d_alpha, int64_t rows, int64_t n,
                   int threads, const float *alpha) {
    switch (dtype) {
        case F32: backward<kind>(static_cast<const float *>(grad), y, out, d_alpha, rows, n, threads, alpha); return 0;
        case BF16: backward<kind>(static_cast<const uint16_t *>(grad), y, out, d_alpha, rows, n, threads, alpha); return 0;
        default: return -2;
    }
}

}  // namespace

extern "C" {

int vitscope_abi_version() { return 4; }

// kind: a code of kinds.def; dtype: 0 float32, 1 bfloat16 input x; alpha: one float per row (kind alpha only,
// else ignored and may be null). Returns 0, -1 for an unknown kind, -2 for an unknown dtype.
int vitscope_forward(int kind, int dtype, const float *alpha, const void *x, float *y, uint8_t *ok, int64_t rows,
                     int64_t n, int threads, int max_iter) {
    switch (kind) {
        case SPARSEMAX: return forward_typed<SPARSEMAX>(dtype, x, y, ok, rows, n, threads, max_iter, alpha);
        case ENTMAX15: return forward_typed<ENTMAX15>(dtype, x, y, ok, rows, n, threads, max_iter, alpha);
        case ALPHA: return forward_typed<ALPHA>(dtype, x, y, ok, rows, n, threads, max_iter, alpha);
        default: return -1;
    }
}

// grad (dtype as above), y float32 -> out float32; d_alpha (one float per row, kind alpha only) may be null.
int vitscope_backward(int kind, int dtype, const float *alpha, const void *grad, const float *y, float *out,
                      float *d_alpha, int64_t rows, int64_t n, int threads) {
    switch (kind) {
        case SPARSEMAX: return backward_typed<SPARSEMAX>(dtype, grad, y, out, nullptr, rows, n, threads, alpha);
        case ENTMAX15: return backward_typed<ENTMAX15>(dtype, grad, y, out, nullptr, rows, n, threads, alpha);
        case ALPHA: return backward_typed<ALPHA>(dtype, grad, y, out, d_alpha, rows, n, threads, alpha);
        default: return -1;
    }
}

}  // extern "C"
