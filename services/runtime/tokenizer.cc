#include "services/runtime/tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace kvtier::runtime {
namespace {

// Length of the valid UTF-8 sequence at the front of `s`, 0 if invalid.
size_t ValidUtf8Prefix(std::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(s[i]); };
  const unsigned char lead = byte(0);
  size_t length;
  uint32_t min;
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, min = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, min = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() < length) return 0;
  uint32_t code = lead & (0x7F >> length);
  for (size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
    code = (code << 6) | (byte(i) & 0x3F);
  }
  // No overlong forms, surrogates or code points past U+10FFFF.
  if (code < min || (code >= 0xD800 && code <= 0xDFFF) || code > 0x10FFFF) return 0;
  return length;
}

}  // namespace

absl::StatusOr<std::string> ReadTokenizerClass(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  std::ifstream in(path);
  if (!in) return std::string();
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("tokenizer_class") || !j["tokenizer_class"].is_string() ||
      j["tokenizer_class"].get<std::string>().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object with a tokenizer_class"));
  }
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
    const size_t n = ValidUtf8Prefix(rest);
    text.append(n == 0 ? "\xEF\xBF\xBD" : rest.substr(0, n));
    rest.remove_prefix(n == 0 ? 1 : n);
  }
  return text;
}

}  // namespace kvtier::runtime
