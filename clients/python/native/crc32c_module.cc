// kvtier._crc32c: the services' own CRC32C for the Python client's block
// records. Debian's python3-crc32c is built without its hardware path, so a
// verified get() spent as long checking records as receiving them; this
// module uses the crc32 instruction or carry-less multiplication where the
// CPU has them (services/kvblock/crc32c.cc), the same value either way.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

// Compiled into the module itself, so that setuptools (pip install) builds
// one source file, as CMake does.
#include "services/kvblock/crc32c.cc"

namespace {

// A record is a megabyte or more: check it with the GIL released, so that
// the client's other threads (gRPC's receive among them) go on meanwhile.
constexpr Py_ssize_t kReleaseGilBytes = 64 * 1024;

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
  crc = kvtier::kvblock::Crc32cExtend(crc, view.buf, static_cast<size_t>(view.len));
  if (released != nullptr) PyEval_RestoreThread(released);
  PyBuffer_Release(&view);
  return PyLong_FromUnsignedLong(crc);
}

PyMethodDef kMethods[] = {
    {"crc32c", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Crc32c)), METH_FASTCALL,
     "crc32c(data, crc=0) -> int: the CRC32C (Castagnoli) of a bytes-like object, continuing from crc"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT,
                       "kvtier._crc32c",
                       "kvtier's CRC32C, in hardware where the CPU has it",
                       -1,
                       kMethods,
                       nullptr,
                       nullptr,
                       nullptr,
                       nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__crc32c() { return PyModule_Create(&kModule); }
