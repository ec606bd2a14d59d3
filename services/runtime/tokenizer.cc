#include "services/runtime/tokenizer.h"

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

namespace kvtier::runtime {
namespace {

// At the front of `s`: the length of a well-formed UTF-8 character
// (`valid`), or of the longest start of one there (at least 1 byte), which
// becomes one U+FFFD: Unicode's "maximal subpart" rule, as Python's and
// browsers' decoders apply it.
size_t Utf8Front(std::string_view s, bool& valid) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(0);
  valid = lead < 0x80;
  if (valid) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // where the second byte may lie
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing past U+10FFFF
  } else {
    return 1;
  }
  size_t n = 1;
  for (; n < length && n < s.size(); ++n) {
    const unsigned char b = byte(n);
    if (n == 1 ? (b < low || b > high) : (b < 0x80 || b > 0xBF)) break;
  }
  valid = n == length;
  return n;
}

}  // namespace

absl::StatusOr<std::string> ParseTokenizerClass(const std::string& json_text) {
  const nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return absl::InvalidArgumentError("not a JSON object");
  if (!j.contains("tokenizer_class") || j["tokenizer_class"].is_null()) return std::string();
  if (!j["tokenizer_class"].is_string()) return absl::InvalidArgumentError("tokenizer_class is not a string");
  return j["tokenizer_class"].get<std::string>();
}

absl::StatusOr<ByteTokenizer> ByteTokenizer::ForClass(const std::string& tokenizer_class, int64_t vocab_size) {
  if (tokenizer_class.empty()) {
    return absl::FailedPreconditionError("the model has no tokenizer (no tokenizer_config.json); give token ids");
  }
  if (tokenizer_class != kByteTokenizerClass) {
    return absl::UnimplementedError(absl::StrCat("tokenizer \"", tokenizer_class, "\" is not one kvtier knows (only ",
                                                 kByteTokenizerClass, "); give token ids instead"));
  }
  if (vocab_size < kByteOffset + 256) {
    return absl::InvalidArgumentError(absl::StrCat(kByteTokenizerClass, " needs ", kByteOffset + 256,
                                                   " ids; the model's vocabulary has ", vocab_size));
  }
  return ByteTokenizer();
}

std::vector<uint32_t> ByteTokenizer::Encode(std::string_view text) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<unsigned char>(c) + kByteOffset);
  return ids;
}

std::string ByteTokenizer::Decode(std::span<const uint32_t> ids) const {
  std::string bytes;
  for (uint32_t id : ids) {
    if (id >= kByteOffset && id < kByteOffset + 256) bytes.push_back(static_cast<char>(id - kByteOffset));
  }
  std::string text;
  for (std::string_view rest = bytes; !rest.empty();) {
    bool valid;
    const size_t n = Utf8Front(rest, valid);
    text.append(valid ? rest.substr(0, n) : "\xEF\xBF\xBD");
    rest.remove_prefix(n);
  }
  return text;
}

}  // namespace kvtier::runtime
