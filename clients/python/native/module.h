// kvtier._native: the services' own C++ for the Python client, where numpy
// or Debian's Python packages are slower: the CRC32C every record is
// checked with (crc32c.cc) and the latent codecs (codecs.cc). Each function
// takes the arguments of CPython's vectorcall (METH_FASTCALL).
#ifndef KVTIER_CLIENTS_PYTHON_NATIVE_MODULE_H_
#define KVTIER_CLIENTS_PYTHON_NATIVE_MODULE_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstddef>
#include <cstdint>
#include <optional>

namespace kvtier::python {

PyObject* Crc32c(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* Quantize(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* Dequantize(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

// `arg` as a uint32_t; nullopt with a Python error set when it is not one.
inline std::optional<uint32_t> Uint32Arg(PyObject* arg, const char* name) {
  const unsigned long long value = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return std::nullopt;
  if (value > UINT32_MAX) {
    PyErr_Format(PyExc_OverflowError, "%s %llu is out of range", name, value);
    return std::nullopt;
  }
  return static_cast<uint32_t>(value);
}

// An object's bytes as one C-contiguous buffer, held until this goes.
class Buffer {
 public:
  explicit Buffer(PyObject* object) : ok_(PyObject_GetBuffer(object, &view_, PyBUF_SIMPLE) == 0) {}
  ~Buffer() {
    if (ok_) PyBuffer_Release(&view_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  bool ok() const { return ok_; }  // false: not a contiguous buffer, a Python error set
  const void* data() const { return view_.buf; }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_;
  const bool ok_;
};

// f() with the GIL released when it works through `bytes` or more, so that
// the client's other threads (gRPC's receive among them) go on meanwhile.
template <typename F>
auto WithoutGilFor(size_t bytes, F f) {
  constexpr size_t kReleaseGilBytes = 64 * 1024;
  if (bytes < kReleaseGilBytes) return f();
  PyThreadState* state = PyEval_SaveThread();
  auto result = f();
  PyEval_RestoreThread(state);
  return result;
}

}  // namespace kvtier::python

#endif  // KVTIER_CLIENTS_PYTHON_NATIVE_MODULE_H_
