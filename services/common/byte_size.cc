#include "services/common/byte_size.h"

#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier {

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[digits]))) ++digits;
  uint64_t value = 0;
  if (digits == 0 || !absl::SimpleAtoi(text.substr(0, digits), &value)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size like 4GiB"));
  }
  std::string unit = absl::AsciiStrToUpper(text.substr(digits));
  if (unit.size() >= 2 && unit.substr(unit.size() - 2) == "IB") unit.resize(unit.size() - 2);
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  int shift = 0;
  if (unit == "K") {
    shift = 10;
  } else if (unit == "M") {
    shift = 20;
  } else if (unit == "G") {
    shift = 30;
  } else if (unit == "T") {
    shift = 40;
  } else if (!unit.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' has an unknown unit"));
  }
  if (shift > 0 && value > (UINT64_MAX >> shift)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is too large"));
  }
  return value << shift;
}

uint64_t PhysicalMemoryBytes() {
  return static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace kvtier
