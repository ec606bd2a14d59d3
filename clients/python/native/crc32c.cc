// kvtier._native.crc32c: services/kvblock's CRC32C (the crc32 instruction
// or carry-less multiplication where the CPU has them, the same value
// either way). Debian's python3-crc32c is built without its hardware path,
// so a verified get() spent as long checking records as receiving them.
#include "services/kvblock/crc32c.h"

#include <cstdint>

#include "native/module.h"

namespace kvtier::python {

// crc32c(data, crc=0): the CRC32C of `data` (any C-contiguous buffer),
// continuing from `crc`, the value of the bytes before it.
PyObject* Crc32c(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "crc32c(data, crc=0) takes one or two arguments");
    return nullptr;
  }
  uint32_t crc = 0;
  if (nargs == 2) {
    const unsigned long long value = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) return nullptr;
    if (value > UINT32_MAX) {
      PyErr_SetString(PyExc_OverflowError, "crc32c: crc is a 32-bit value");
      return nullptr;
    }
    crc = static_cast<uint32_t>(value);
  }
  Py_buffer view;
  if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0) return nullptr;
  PyThreadState* released = view.len >= kReleaseGilBytes ? PyEval_SaveThread() : nullptr;
  crc = kvblock::Crc32cExtend(crc, view.buf, static_cast<size_t>(view.len));
  if (released != nullptr) PyEval_RestoreThread(released);
  PyBuffer_Release(&view);
  return PyLong_FromUnsignedLong(crc);
}

}  // namespace kvtier::python
