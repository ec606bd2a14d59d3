// Safetensors files, the weight format of Hugging Face checkpoints:
//   u64le header length N | N bytes of JSON | tensor bytes
// where the JSON maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end)} relative to the end of the header. Files are memory-mapped,
// never read twice; nothing in a file is trusted.
#ifndef KVTIER_SERVICES_RUNTIME_SAFETENSORS_H_
#define KVTIER_SERVICES_RUNTIME_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::runtime {

// F8_E4M3 is OCP FP8 E4M3FN, as DeepSeek-V3 publishes its projections (with
// a block scale tensor beside each: model_weights.h).
enum class DType { kBf16, kF16, kF32, kF8E4m3, kF8E8m0, kI8, kI32, kI64 };

// "BF16", "F16", "F32", "F8_E4M3", "F8_E8M0" (power-of-two scales), "I8"
// (DeepSeek-V4's packed FP4 experts), "I32", "I64", as in the files.
const char* DTypeName(DType dtype);
size_t DTypeBytes(DType dtype);

// A tensor inside a mapped file; valid while its SafetensorsFile lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::span<const uint8_t> bytes;

  int64_t elements() const;
  // The values as float32 (bf16, f16 and fp8 widened exactly; an fp8
  // tensor's codes without their block scales; an E8M0 scale as 2^(byte -
  // 127), NaN for 0xff; integers exact up to 2^24, as the small index
  // tables checkpoints hold them are).
  std::vector<float> ToFloat() const;
};

// A memory-mapped .safetensors file. Immutable after Open; thread-safe.
class SafetensorsFile {
 public:
  // Maps and validates `path`. INVALID_ARGUMENT (naming the file and, where
  // there is one, the tensor) for: a file shorter than its header, a header
  // that is not a JSON object of tensors, an unknown dtype, a shape or
  // offsets that disagree with the dtype, data beyond the end of the file.
  // NOT_FOUND when the file cannot be opened.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // NOT_FOUND naming the tensor and file when absent.
  absl::StatusOr<TensorView> Tensor(const std::string& name) const;

 private:
  SafetensorsFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  size_t size_;
  std::map<std::string, TensorView> tensors_;
};

// A tensor to write: float32 values stored as `dtype` (rounded to nearest
// even for bf16, f16 and fp8, fp8 saturating at 448; powers of two for
// E8M0; whole numbers for the integer types).
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kBf16;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Writes a safetensors file (what `kvtier make-model` produces).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

// IEEE binary16 conversions (f16 checkpoints).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_SAFETENSORS_H_
