// cuBLAS, opened with dlopen the first time a Blas is made instead of being
// linked: its libraries carry about 110 KB of static thread-local storage,
// which glibc carves out of every thread's stack in a program that links
// them, so threads made with small stacks (gRPC's and other libraries')
// fail to start. Opened at run time, the storage is allocated apart, and
// only programs that run GEMMs load it.
// For the .cu/.cc files of this directory.
#ifndef KVTIER_KERNELS_CUDA_CUBLAS_LOADER_H_
#define KVTIER_KERNELS_CUDA_CUBLAS_LOADER_H_

#include <cublas_v2.h>

#include <string>

namespace kvtier::kernels::cuda {

// The cuBLAS functions the kernels call, as the C API declares them.
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                            const void*, const void*, cudaDataType, int, long long int, const void*,
                                            cudaDataType, int, long long int, const void*, void*, cudaDataType, int,
                                            long long int, int, cublasComputeType_t, cublasGemmAlgo_t);
  const char* (*status_string)(cublasStatus_t);
};

// The API, opened once (thread-safe); null, with *why set, when the library
// or a function is missing.
const CublasApi* Cublas(std::string* why);

}  // namespace kvtier::kernels::cuda

#endif  // KVTIER_KERNELS_CUDA_CUBLAS_LOADER_H_
