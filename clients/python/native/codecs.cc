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

// True when `status` is; else false with a ValueError of its message.
bool Ok(const kernels::Status& status) {
  if (!status.ok()) PyErr_SetString(PyExc_ValueError, status.message().c_str());
  return status.ok();
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
    const std::optional<uint32_t> v = Uint32Arg(args[kIndex[k]], kName[k]);
    if (!v) return false;
    value[k] = *v;
  }
  if (value[0] > UINT8_MAX || !kernels::IsKnownCodec(static_cast<uint8_t>(value[0]))) {
    PyErr_Format(PyExc_ValueError, "unknown codec %u", value[0]);
    return false;
  }
  *codec = static_cast<Codec>(value[0]);
  *shape = BlockShape{value[1], value[2], value[3]};
  return Ok(kernels::ValidateShape(*shape));
}

}  // namespace

PyObject* Quantize(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Codec codec;
  BlockShape shape;
  if (!CodecAndShape("quantize", args, nargs, &codec, &shape)) return nullptr;
  const Buffer in(args[1]);
  if (!in.ok()) return nullptr;
  if (in.size() != shape.values() * sizeof(float)) {
    return PyErr_Format(PyExc_ValueError, "latents of %zu bytes, %u x (%u + %u) float32 take %zu", in.size(),
                        shape.tokens, shape.latent_dim, shape.rope_dim, shape.values() * sizeof(float));
  }
  if (reinterpret_cast<uintptr_t>(in.data()) % alignof(float) != 0) {
    return PyErr_Format(PyExc_ValueError, "latents not aligned to float32");
  }
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(EncodedBytes(codec, shape)));
  if (out == nullptr) return nullptr;
  // A bytes object nobody else holds yet may be written.
  const std::span<uint8_t> bytes(reinterpret_cast<uint8_t*>(PyBytes_AS_STRING(out)),
                                 static_cast<size_t>(PyBytes_GET_SIZE(out)));
  const std::span<const float> values(static_cast<const float*>(in.data()), shape.values());
  if (!Ok(WithoutGilFor(in.size(), [&] { return kernels::Quantize(codec, shape, values, bytes); }))) Py_CLEAR(out);
  return out;
}

PyObject* Dequantize(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Codec codec;
  BlockShape shape;
  if (!CodecAndShape("dequantize", args, nargs, &codec, &shape)) return nullptr;
  const Buffer in(args[1]);
  if (!in.ok()) return nullptr;
  if (in.size() != EncodedBytes(codec, shape)) {
    return PyErr_Format(PyExc_ValueError, "a %u-token layer in this codec is %zu bytes, got %zu", shape.tokens,
                        EncodedBytes(codec, shape), in.size());
  }
  PyObject* out = PyByteArray_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(shape.values() * sizeof(float)));
  if (out == nullptr) return nullptr;
  const std::span<float> values(reinterpret_cast<float*>(PyByteArray_AS_STRING(out)), shape.values());
  const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(in.data()), in.size());
  if (!Ok(WithoutGilFor(in.size(), [&] { return kernels::Dequantize(codec, shape, bytes, values); }))) Py_CLEAR(out);
  return out;
}

}  // namespace kvtier::python
