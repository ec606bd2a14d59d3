#include "services/runtime/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvtier/kernels/float_formats.h"

namespace kvtier::runtime {
namespace {

using nlohmann::json;

constexpr int64_t kMaxElements = int64_t{1} << 40;

constexpr DType kDTypes[] = {DType::kBf16,   DType::kF16, DType::kF32, DType::kF8E4m3,
                             DType::kF8E8m0, DType::kI8,  DType::kI32, DType::kI64};

absl::StatusOr<DType> ParseDType(const std::string& name) {
  std::vector<std::string> names;
  for (DType d : kDTypes) {
    if (name == DTypeName(d)) return d;
    names.push_back(DTypeName(d));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("dtype ", name, " is not supported (", absl::StrJoin(names, ", "), ")"));
}

}  // namespace

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBf16:
      return "BF16";
    case DType::kF16:
      return "F16";
    case DType::kF32:
      return "F32";
    case DType::kF8E4m3:
      return "F8_E4M3";
    case DType::kF8E8m0:
      return "F8_E8M0";
    case DType::kI8:
      return "I8";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

size_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kF8E4m3:
    case DType::kF8E8m0:
    case DType::kI8:
      return 1;
    default:
      return 2;
  }
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  if (exponent == 0) {
    const float v = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -v : v;
  }
  if (exponent == 31) return kernels::BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return kernels::BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToHalf(float f) {
  const uint32_t u = kernels::FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;                    // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;                   // rounds past 65504: inf
  if (a < 0x38800000u) {                                         // below 2^-14: subnormal
    const float scaled = kernels::BitsToFloat(a) * 16777216.0f;  // exact: x 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  const uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  return sign | static_cast<uint16_t>((rounded >> 13) - (112u << 10));
}

int64_t TensorView::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> TensorView::ToFloat() const {
  std::vector<float> out(static_cast<size_t>(elements()));
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&out[i], bytes.data() + 4 * i, 4);
    } else if (dtype == DType::kF8E4m3) {
      out[i] = kernels::Fp8E4m3ToFloat(bytes[i]);
    } else if (dtype == DType::kF8E8m0) {
      out[i] = kernels::E8m0ToFloat(bytes[i]);
    } else if (dtype == DType::kI8) {
      out[i] = static_cast<float>(static_cast<int8_t>(bytes[i]));
    } else if (dtype == DType::kI32) {
      int32_t v;
      std::memcpy(&v, bytes.data() + 4 * i, 4);
      out[i] = static_cast<float>(v);
    } else if (dtype == DType::kI64) {
      int64_t v;
      std::memcpy(&v, bytes.data() + 8 * i, 8);
      out[i] = static_cast<float>(v);
    } else {
      uint16_t h;
      std::memcpy(&h, bytes.data() + 2 * i, 2);
      out[i] = dtype == DType::kBf16 ? kernels::Bf16ToFloat(h) : HalfToFloat(h);
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", size, " bytes, too short for a safetensors header"));
  }
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) return absl::InternalError(absl::StrCat("cannot map ", path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(path, static_cast<const uint8_t*>(map), size));

  uint64_t header_len;
  std::memcpy(&header_len, file->data_, 8);
  if (header_len > size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_len, " runs past the end of the ",
                                                   size, "-byte file (truncated?)"));
  }
  const json header = json::parse(file->data_ + 8, file->data_ + 8 + header_len, nullptr,
                                  /*allow_exceptions=*/false);
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header is not a JSON object"));
  }
  const uint8_t* data = file->data_ + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string& tensor = name;  // a structured binding: not capturable before C++20 in clang 14
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": tensor ", tensor, ": ", why));
    };
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() || !entry.contains("shape") ||
        !entry["shape"].is_array() || !entry.contains("data_offsets") || !entry["data_offsets"].is_array() ||
        entry["data_offsets"].size() != 2) {
      return bad("needs dtype, shape and two data_offsets");
    }
    absl::StatusOr<DType> dtype = ParseDType(entry["dtype"].get<std::string>());
    if (!dtype.ok()) return bad(std::string(dtype.status().message()));
    TensorView view;
    view.name = name;
    view.dtype = *dtype;
    int64_t elements = 1;
    for (const json& d : entry["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(kMaxElements)) {
        return bad("shape has a negative or huge dimension");
      }
      view.shape.push_back(d.get<int64_t>());
      // Checked before multiplying: two dimensions under the limit can
      // overflow 64 bits together (2^24 x 2^40 would wrap to 0 elements).
      if (view.shape.back() != 0 && elements > kMaxElements / view.shape.back()) return bad("shape is too large");
      elements *= view.shape.back();
    }
    const json& offsets = entry["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      return bad("data_offsets must be non-negative integers");
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      return bad(absl::StrCat("data_offsets [", begin, ", ", end, ") outside the ", data_size,
                              " data bytes (truncated file?)"));
    }
    if (end - begin != static_cast<uint64_t>(elements) * DTypeBytes(view.dtype)) {
      return bad(absl::StrCat(end - begin, " bytes, but shape and ", DTypeName(view.dtype), " need ",
                              elements * static_cast<int64_t>(DTypeBytes(view.dtype))));
    }
    view.bytes = std::span<const uint8_t>(data + begin, end - begin);
    file->tensors_.emplace(name, std::move(view));
  }
  return file;
}

SafetensorsFile::~SafetensorsFile() { munmap(const_cast<uint8_t*>(data_), size_); }

absl::StatusOr<TensorView> SafetensorsFile::Tensor(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) return absl::NotFoundError(absl::StrCat("tensor ", name, " not in ", path_));
  return it->second;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  json header = json::object();
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    if (elements != static_cast<int64_t>(t.values.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", t.name, ": ", t.values.size(), " values for a shape of ", elements));
    }
    const uint64_t bytes = t.values.size() * DTypeBytes(t.dtype);
    header[t.name] = {{"dtype", DTypeName(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  std::vector<uint8_t> buffer;
  for (const TensorToWrite& t : tensors) {
    buffer.resize(t.values.size() * DTypeBytes(t.dtype));
    for (size_t i = 0; i < t.values.size(); ++i) {
      if (t.dtype == DType::kF32) {
        std::memcpy(buffer.data() + 4 * i, &t.values[i], 4);
      } else if (t.dtype == DType::kF8E4m3) {
        buffer[i] = kernels::FloatToFp8E4m3(t.values[i]);
      } else if (t.dtype == DType::kF8E8m0) {
        buffer[i] = static_cast<uint8_t>(std::ilogb(t.values[i]) + 127);
      } else if (t.dtype == DType::kI8) {
        buffer[i] = static_cast<uint8_t>(static_cast<int8_t>(t.values[i]));
      } else if (t.dtype == DType::kI32) {
        const auto v = static_cast<int32_t>(t.values[i]);
        std::memcpy(buffer.data() + 4 * i, &v, 4);
      } else if (t.dtype == DType::kI64) {
        const auto v = static_cast<int64_t>(t.values[i]);
        std::memcpy(buffer.data() + 8 * i, &v, 8);
      } else {
        const uint16_t h = t.dtype == DType::kBf16 ? kernels::FloatToBf16(t.values[i]) : FloatToHalf(t.values[i]);
        std::memcpy(buffer.data() + 2 * i, &h, 2);
      }
    }
    out.write(reinterpret_cast<const char*>(buffer.data()), static_cast<std::streamsize>(buffer.size()));
  }
  if (!out.flush()) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace kvtier::runtime
