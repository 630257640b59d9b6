// Running row ranges on several threads: the OpenMP runtime PyTorch has loaded where the library is built with
// -fopenmp (same soname, hence PyTorch's own thread pool: no second pool spinning beside it), else std::thread.
#pragma once

#include <cstdint>
#include <thread>
#include <vector>

namespace vitscope {

// Split rows [0, rows) into `threads` shares (multiples of `align` rows) and run fn(first, last) on each.
template <typename Fn>
void in_parallel(int64_t rows, int64_t align, int threads, Fn fn) {
    const int64_t units = (rows + align - 1) / align;
    if (threads < 1) threads = 1;
    if (threads > units) threads = int(units > 0 ? units : 1);
    const int64_t per = (units + threads - 1) / threads * align;
    auto share = [&](int t) {
        const int64_t first = t * per, last = first + per < rows ? first + per : rows;
        if (first < last) fn(first, last);
    };
#ifdef _OPENMP
    #pragma omp parallel for num_threads(threads) schedule(static, 1)
    for (int t = 0; t < threads; ++t) share(t);
#else
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) {
        try {
            pool.emplace_back(share, t);
        } catch (...) {  // no thread to be had: do that share here
            share(t);
        }
    }
    share(0);
    for (auto &thread : pool) thread.join();
#endif
}

}  // namespace vitscope
