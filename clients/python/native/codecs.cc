// kvtier._native.quantize and .dequantize: the C++ latent codecs
// (kernels/cpu/codec*.cc, vectorized for the CPU they run on) for
// kvtier.codecs, whose numpy codecs make the same bytes several times
// slower.
#include <cstdint>
#include <optional>
#include <span>

#include "kvtier/kernels/codec.h"
#include "native/module.h"

namespace kvtier::python {
namespace {

using kernels::BlockShape;
using kernels::Codec;

// args[i] as a uint32_t; nullopt with a Python error set when it is not one.
std::optional<uint32_t> Uint32Arg(PyObject* const* args, int i, const char* name) {
  const unsigned long long value = PyLong_AsUnsignedLongLong(args[i]);
  if (PyErr_Occurred()) return std::nullopt;
  if (value > UINT32_MAX) {
    PyErr_Format(PyExc_OverflowError, "%s %llu is out of range", name, value);
    return std::nullopt;
  }
  return static_cast<uint32_t>(value);
}

// The codec and shape of (codec, buffer, tokens, latent_dim, rope_dim).
bool CodecAndShape(const char* function, PyObject* const* args, Py_ssize_t nargs, Codec* codec, BlockShape* shape) {
  if (nargs != 5) {
    PyErr_Format(PyExc_TypeError, "%s(codec, buffer, tokens, latent_dim, rope_dim) takes five arguments", function);
    return false;
  }
  // One at a time: no call into Python's API once an error is set.
  constexpr int kIndex[] = {0, 2, 3, 4};
  constexpr const char* kName[] = {"codec", "tokens", "latent_dim", "rope_dim"};
  uint32_t value[4];
  for (int k = 0; k < 4; ++k) {
    const std::optional<uint32_t> v = Uint32Arg(args, kIndex[k], kName[k]);
    if (!v) return false;
    value[k] = *v;
  }
  if (value[0] > UINT8_MAX || !kernels::IsKnownCodec(static_cast<uint8_t>(value[0]))) {
    PyErr_Format(PyExc_ValueError, "unknown codec %u", value[0]);
    return false;
  }
  *codec = static_cast<Codec>(value[0]);
  *shape = BlockShape{value[1], value[2], value[3]};
  if (const kernels::Status valid = kernels::ValidateShape(*shape); !valid.ok()) {
    PyErr_SetString(PyExc_ValueError, valid.message().c_str());
    return false;
  }
  return true;
}

// Runs `work` (returning a kernels::Status) with the GIL released when it
// touches `bytes` or more; a failure becomes a ValueError.
template <typename Work>
bool Run(Py_ssize_t bytes, Work work) {
  PyThreadState* released = bytes >= kReleaseGilBytes ? PyEval_SaveThread() : nullptr;
  const kernels::Status status = work();
  if (released != nullptr) PyEval_RestoreThread(released);
  if (!status.ok()) PyErr_SetString(PyExc_ValueError, status.message().c_str());
  return status.ok();
}

}  // namespace

PyObject* Quantize(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Codec codec;
  BlockShape shape;
  if (!CodecAndShape("quantize", args, nargs, &codec, &shape)) return nullptr;
  Py_buffer in;
  if (PyObject_GetBuffer(args[1], &in, PyBUF_SIMPLE) != 0) return nullptr;
  PyObject* out = nullptr;
  if (static_cast<size_t>(in.len) != shape.values() * sizeof(float)) {
    PyErr_Format(PyExc_ValueError, "latents of %zd bytes, %u x (%u + %u) float32 take %zu", in.len, shape.tokens,
                 shape.latent_dim, shape.rope_dim, shape.values() * sizeof(float));
  } else if (reinterpret_cast<uintptr_t>(in.buf) % alignof(float) != 0) {
    PyErr_SetString(PyExc_ValueError, "latents not aligned to float32");
  } else if ((out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(EncodedBytes(codec, shape))))) {
    // A bytes object nobody else holds yet may be written.
    const std::span<uint8_t> bytes(reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(out)),
                                   static_cast<size_t>(PyBytes_GET_SIZE(out)));
    const std::span<const float> values(static_cast<const float*>(in.buf), shape.values());
    if (!Run(in.len, [&] { return kernels::Quantize(codec, shape, values, bytes); })) Py_CLEAR(out);
  }
  PyBuffer_Release(&in);
  return out;
}

PyObject* Dequantize(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Codec codec;
  BlockShape shape;
  if (!CodecAndShape("dequantize", args, nargs, &codec, &shape)) return nullptr;
  Py_buffer in;
  if (PyObject_GetBuffer(args[1], &in, PyBUF_SIMPLE) != 0) return nullptr;
  PyObject* out = nullptr;
  if (static_cast<size_t>(in.len) != EncodedBytes(codec, shape)) {
    PyErr_Format(PyExc_ValueError, "a %u-token layer in this codec is %zu bytes, got %zd", shape.tokens,
                 EncodedBytes(codec, shape), in.len);
  } else if ((out = PyByteArray_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(shape.values() * sizeof(float))))) {
    const std::span<float> values(reinterpret_cast<float*>(PyByteArray_AS_STRING(out)), shape.values());
    const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(in.buf), static_cast<size_t>(in.len));
    if (!Run(in.len, [&] { return kernels::Dequantize(codec, shape, bytes, values); })) Py_CLEAR(out);
  }
  PyBuffer_Release(&in);
  return out;
}

}  // namespace kvtier::python
