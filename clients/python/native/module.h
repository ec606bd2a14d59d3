// kvtier._native: the services' own C++ for the Python client, where numpy
// or Debian's Python packages are slower: the CRC32C every record is
// checked with (crc32c.cc) and the latent codecs (codecs.cc). Each function
// takes the arguments of CPython's vectorcall (METH_FASTCALL).
#ifndef KVTIER_CLIENTS_PYTHON_NATIVE_MODULE_H_
#define KVTIER_CLIENTS_PYTHON_NATIVE_MODULE_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace kvtier::python {

PyObject* Crc32c(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* Quantize(PyObject* module, PyObject* const* args, Py_ssize_t nargs);
PyObject* Dequantize(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

// Work on buffers this large runs with the GIL released, so that the
// client's other threads (gRPC's receive among them) go on meanwhile.
inline constexpr Py_ssize_t kReleaseGilBytes = 64 * 1024;

}  // namespace kvtier::python

#endif  // KVTIER_CLIENTS_PYTHON_NATIVE_MODULE_H_
