// Worker threads for the kernels' large loops (Gemm's weight rows). One
// process-wide pool: the decode worker, the prefill node and `kvtier run`
// set its size once at start-up. Results never depend on the thread count:
// each output is computed by one thread in a fixed order.
#ifndef KVTIER_KERNELS_PARALLEL_H_
#define KVTIER_KERNELS_PARALLEL_H_

#include <cstddef>
#include <functional>

namespace kvtier::kernels {

// Threads that work on one call, the caller's included; 1 (the default)
// runs everything on the caller. Call before the first parallel loop.
void SetKernelThreads(size_t threads);
size_t KernelThreads();

// Runs fn(begin, end) over [0, n) split into at most KernelThreads()
// contiguous chunks of at least `min_chunk` each; returns when all are
// done. Callers from several threads share the pool; a call made inside a
// chunk runs inline.
void ParallelFor(size_t n, size_t min_chunk, const std::function<void(size_t begin, size_t end)>& fn);

}  // namespace kvtier::kernels

#endif  // KVTIER_KERNELS_PARALLEL_H_
