// kvtier._native.crc32c: services/kvblock's CRC32C (the crc32 instruction
// or carry-less multiplication where the CPU has them, the same value
// either way). Debian's python3-crc32c is built without its hardware path,
// so a verified get() spent as long checking records as receiving them.
#include "services/kvblock/crc32c.h"

#include <cstdint>
#include <optional>

#include "native/module.h"

namespace kvtier::python {

// crc32c(data, crc=0): the CRC32C of `data` (any C-contiguous buffer),
// continuing from `crc`, the value of the bytes before it.
PyObject* Crc32c(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 2) {
    PyErr_SetString(PyExc_TypeError, "crc32c(data, crc=0) takes one or two arguments");
    return nullptr;
  }
  const std::optional<uint32_t> crc = nargs == 2 ? Uint32Arg(args[1], "crc") : std::optional<uint32_t>(0);
  if (!crc) return nullptr;
  const Buffer data(args[0]);
  if (!data.ok()) return nullptr;
  return PyLong_FromUnsignedLong(
      WithoutGilFor(data.size(), [&] { return kvblock::Crc32cExtend(*crc, data.data(), data.size()); }));
}

}  // namespace kvtier::python
