#include "cublas_loader.h"

#include <dlfcn.h>

#include <type_traits>

namespace kvtier::kernels::cuda {
namespace {

// The C declarations the pointers must match (decltype: unevaluated, so
// nothing is linked): a signature cuBLAS changes fails to compile here, not
// to run. The static_cast picks the C overload of the C++ wrappers.
#define KVTIER_CUBLAS_MATCHES(field, function) \
  static_assert(                               \
      std::is_same_v<decltype(CublasApi::field), decltype(static_cast<decltype(CublasApi::field)>(&function))>)
KVTIER_CUBLAS_MATCHES(create, cublasCreate_v2);
KVTIER_CUBLAS_MATCHES(destroy, cublasDestroy_v2);
KVTIER_CUBLAS_MATCHES(set_stream, cublasSetStream_v2);
KVTIER_CUBLAS_MATCHES(gemm_strided_batched_ex, cublasGemmStridedBatchedEx);
KVTIER_CUBLAS_MATCHES(status_string, cublasGetStatusString);
#undef KVTIER_CUBLAS_MATCHES

template <typename F>
bool Find(void* library, const char* name, F& out, std::string& why) {
  out = reinterpret_cast<F>(dlsym(library, name));
  if (out == nullptr) why = std::string("cuBLAS has no ") + name;
  return out != nullptr;
}

struct Loaded {
  CublasApi api{};
  bool ok = false;
  std::string why;
};

Loaded Open() {
  Loaded l;
  // The soname first (LD_LIBRARY_PATH, the system's paths), then the
  // library this build was configured with.
  void* library = dlopen("libcublas.so.13", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) library = dlopen(KVTIER_CUBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    l.why = std::string("cannot open cuBLAS: ") + (error != nullptr ? error : "unknown error");
    return l;
  }
  l.ok = Find(library, "cublasCreate_v2", l.api.create, l.why) &&
         Find(library, "cublasDestroy_v2", l.api.destroy, l.why) &&
         Find(library, "cublasSetStream_v2", l.api.set_stream, l.why) &&
         Find(library, "cublasGemmStridedBatchedEx", l.api.gemm_strided_batched_ex, l.why) &&
         Find(library, "cublasGetStatusString", l.api.status_string, l.why);
  return l;  // the library stays open for the process's life
}

}  // namespace

const CublasApi* Cublas(std::string* why) {
  static const Loaded loaded = Open();
  if (!loaded.ok && why != nullptr) *why = loaded.why;
  return loaded.ok ? &loaded.api : nullptr;
}

}  // namespace kvtier::kernels::cuda
