// Running rows on several threads: the OpenMP runtime PyTorch has loaded where the library is built with
// -fopenmp (same soname, hence PyTorch's own thread pool: no second pool spinning beside it), else std::thread.
//
// Rows are handed out in chunks as threads become free (dynamic scheduling), not split into one fixed share per
// thread: on a shared machine the OS may preempt one thread for milliseconds, and with fixed shares the whole call
// then waits for that thread's share; with chunks the other threads take the rest. (Rows can also differ in cost,
// alpha-entmax's with the alpha, though attention rows interleave their heads finely enough that fixed halves get
// the same mix.)
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace vitscope {

// Rows [0, rows) as chunks of `chunk` rows (the last one shorter), taken in turn by whichever thread asks next
class RowChunks {
  public:
    RowChunks(int64_t rows, int64_t chunk) : rows_(rows), chunk_(chunk < 1 ? 1 : chunk) {}

    // The next chunk [first, last); false when none is left
    bool next(int64_t &first, int64_t &last) {
        first = next_.fetch_add(chunk_, std::memory_order_relaxed);
        if (first >= rows_) return false;
        last = first + chunk_ < rows_ ? first + chunk_ : rows_;
        return true;
    }

  private:
    const int64_t rows_, chunk_;
    std::atomic<int64_t> next_{0};
};

// Run work(chunks) on up to `threads` threads (no more than there are chunks of `chunk` rows in [0, rows)); each
// call takes chunks with chunks.next(first, last) until none is left, so per-thread setup (scratch buffers) is done
// once per thread, not once per chunk.
template <typename Work>
void in_parallel(int64_t rows, int64_t chunk, int threads, Work work) {
    RowChunks chunks(rows, chunk);
    const int64_t count = chunk < 1 ? rows : (rows + chunk - 1) / chunk;
    if (threads < 1) threads = 1;
    if (threads > count) threads = int(count > 0 ? count : 1);
    if (threads == 1) {
        work(chunks);
        return;
    }
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads)
    work(chunks);
#else
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) {
        try {
            pool.emplace_back([&] { work(chunks); });
        } catch (...) {  // no thread to be had: the threads there are take all the chunks
            break;
        }
    }
    work(chunks);
    for (auto &thread : pool) thread.join();
#endif
}

}  // namespace vitscope
