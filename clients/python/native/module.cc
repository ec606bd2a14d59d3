// kvtier._native's method table (module.h says what it is for).
#include "native/module.h"

namespace {

template <auto F>
PyCFunction Fast() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(F));
}

PyMethodDef kMethods[] = {
    {"crc32c", Fast<kvtier::python::Crc32c>(), METH_FASTCALL,
     "crc32c(data, crc=0) -> int: the CRC32C (Castagnoli) of a bytes-like object, continuing from crc"},
    {"quantize", Fast<kvtier::python::Quantize>(), METH_FASTCALL,
     "quantize(codec, latents, tokens, latent_dim, rope_dim) -> bytes: one layer of one block in the codec "
     "(1 bf16, 2 fp8, 3 int8, 4 int4); latents: C-contiguous float32, tokens x (latent_dim + rope_dim)"},
    {"dequantize", Fast<kvtier::python::Dequantize>(), METH_FASTCALL,
     "dequantize(codec, payload, tokens, latent_dim, rope_dim) -> bytearray: the layer's float32 values"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT,
                       "kvtier._native",
                       "kvtier's C++ CRC32C and latent codecs",
                       -1,
                       kMethods,
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__native() { return PyModule_Create(&kModule); }
