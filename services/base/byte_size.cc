#include "services/base/byte_size.h"

#include <unistd.h>

#include <fstream>
#include <optional>

#include "absl/numeric/int128.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace kvtier {
namespace {

// The leading run of digits of `text` from `at` on, moving `at` past it.
std::string Digits(const std::string& text, size_t& at) {
  const size_t begin = at;
  while (at < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[at]))) ++at;
  return text.substr(begin, at - begin);
}

// A whole number of bytes in a cgroup file ("max": none).
std::optional<uint64_t> CgroupBytes(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  uint64_t bytes = 0;
  if (!(in >> text) || !absl::SimpleAtoi(text, &bytes)) return std::nullopt;
  return bytes;
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(const std::string& text) {
  const absl::Status not_a_size =
      absl::InvalidArgumentError(absl::StrCat("'", text, "' is not a size like 4GiB, 4Gi or 1.5GiB"));
  size_t at = 0;
  const std::string whole = Digits(text, at);
  std::string fraction;
  if (at < text.size() && text[at] == '.') {
    fraction = Digits(text, ++at);
    if (fraction.empty() || fraction.size() > 9) return not_a_size;
  }
  uint64_t value = 0;
  if (whole.empty() || !absl::SimpleAtoi(whole, &value)) return not_a_size;
  // "", "B", or one of K, M, G, T followed by "I" or "IB" (binary) or by
  // nothing or "B" (decimal).
  const std::string unit = absl::AsciiStrToUpper(text.substr(at));
  const size_t letter = unit.empty() ? std::string::npos : std::string("KMGT").find(unit[0]);
  const std::string rest = letter == std::string::npos ? unit : unit.substr(1);
  if (rest != "" && rest != "B" && (letter == std::string::npos || (rest != "I" && rest != "IB"))) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text,
                     "' has an unknown unit (bytes; KiB, MiB, GiB, TiB or Ki, Mi, Gi, Ti for powers of 1024; "
                     "KB, MB, GB, TB or K, M, G, T for powers of 1000)"));
  }
  const bool binary = rest == "I" || rest == "IB";
  absl::uint128 multiple = 1;
  if (letter != std::string::npos) {
    for (size_t i = 0; i <= letter; ++i) multiple *= binary ? 1024 : 1000;
  }
  uint64_t scale = 1;
  for (size_t i = 0; i < fraction.size(); ++i) scale *= 10;
  uint64_t numerator = 0;
  if (!fraction.empty()) (void)absl::SimpleAtoi(fraction, &numerator);
  const absl::uint128 bytes = absl::uint128(value) * multiple + absl::uint128(numerator) * multiple / scale;
  if (bytes > absl::uint128(UINT64_MAX)) return absl::InvalidArgumentError(absl::StrCat("'", text, "' is too large"));
  return static_cast<uint64_t>(bytes);
}

absl::StatusOr<uint64_t> ParseByteSizeFlag(const char* flag, const std::string& value) {
  absl::StatusOr<uint64_t> bytes = ParseByteSize(value);
  if (!bytes.ok()) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": ", bytes.status().message()));
  return bytes;
}

MemoryLimit ProcessMemoryLimit(const std::string& cgroup_root) {
  MemoryLimit limit;
  limit.bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  for (const char* file : {"/memory.max", "/memory/memory.limit_in_bytes"}) {
    // v1 says "no limit" with a huge number: it is then above the machine's.
    if (std::optional<uint64_t> cgroup = CgroupBytes(cgroup_root + file); cgroup && *cgroup < limit.bytes) {
      limit = {*cgroup, true};
      break;
    }
  }
  return limit;
}

}  // namespace kvtier
