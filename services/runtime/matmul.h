// The row-major product the runtime's layers share.
#ifndef KVTIER_SERVICES_RUNTIME_MATMUL_H_
#define KVTIER_SERVICES_RUNTIME_MATMUL_H_

#include <vector>

#include "kvtier/kernels/layers.h"

namespace kvtier::runtime {

// y[n][rows] = x[n][cols] W^T for W [rows][cols]: each weight row read once
// for all n inputs.
inline void MatMul(const std::vector<float>& w, size_t rows, size_t cols, const float* x, size_t n,
                   float* y) {
  kernels::Gemm(w.data(), rows, cols, x, n, cols, y, rows);
}

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_MATMUL_H_
