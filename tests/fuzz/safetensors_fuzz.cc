// SafetensorsFile::Open, on any file an operator points kvtier at: it
// refuses a malformed header or offsets with an error, and every tensor of
// a file it accepts lies inside the file, its bytes exactly its shape's
// elements of its dtype, readable as floats. Input: the file.
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "services/runtime/safetensors.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/temp_dir.h"

namespace kvtier::fuzz {

std::vector<std::string> Seeds() {
  using runtime::DType;
  std::vector<runtime::TensorToWrite> tensors;
  for (DType dtype :
       {DType::kBf16, DType::kF16, DType::kF32, DType::kF8E4m3, DType::kF8E8m0, DType::kI8, DType::kI32, DType::kI64}) {
    tensors.push_back({std::string("t.") + runtime::DTypeName(dtype), dtype, {2, 3}, {1, 2, 4, 8, 16, 32}});
  }
  tensors.push_back({"scalar", DType::kF32, {}, {0.5f}});
  tensors.push_back({"empty", DType::kBf16, {0, 4}, {}});
  const testing::TempDir dir("kvtier_fuzz_seed_");
  const std::string path = (dir / "seed.safetensors").string();
  std::vector<std::string> seeds;
  if (runtime::WriteSafetensors(path, tensors).ok()) {
    std::ifstream in(path, std::ios::binary);
    seeds.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return seeds;
}

}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::runtime;
  const int fd = memfd_create("safetensors-fuzz", 0);
  if (fd < 0) return 0;
  for (size_t at = 0; at < size;) {
    const ssize_t n = write(fd, data + at, size - at);
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  const absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open("/proc/self/fd/" + std::to_string(fd));
  close(fd);
  if (!file.ok()) return 0;
  for (const auto& [name, tensor] : (*file)->tensors()) {
    int64_t elements = 1;
    for (int64_t d : tensor.shape) elements *= d;
    KVTIER_FUZZ_CHECK(tensor.elements() == elements);
    KVTIER_FUZZ_CHECK(tensor.bytes.size() == static_cast<size_t>(elements) * DTypeBytes(tensor.dtype));
    // Inside the mapped file: reading its ends faults otherwise.
    if (!tensor.bytes.empty()) {
      volatile uint8_t ends = tensor.bytes.front() ^ tensor.bytes.back();
      (void)ends;
    }
    KVTIER_FUZZ_CHECK((*file)->Tensor(name).ok());
    if (elements <= (1 << 16)) KVTIER_FUZZ_CHECK(tensor.ToFloat().size() == static_cast<size_t>(elements));
  }
  return 0;
}
