// The tokenizer a checkpoint names in tokenizer_config.json, for turning a
// person's text into ids and ids back into text. Token ids stay the wire
// format; only programs that take text (--prompt) use this. kvtier knows
// one tokenizer: ByT5's byte-level layout (0 pad, 1 end of text "</s>",
// 2 unknown, byte b as b + 3, extra ids after the bytes), which needs no
// vocabulary file. Immutable; thread-safe.
#ifndef KVTIER_SERVICES_RUNTIME_TOKENIZER_H_
#define KVTIER_SERVICES_RUNTIME_TOKENIZER_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kvtier::runtime {

// The tokenizer_class ByteTokenizer implements, as ServerInfo.tokenizer
// reports it.
inline constexpr char kByteTokenizerClass[] = "ByT5Tokenizer";

// The tokenizer_class a tokenizer_config.json's text names, whichever it
// is; empty when it names none (some checkpoints leave the class to
// tokenizer.json). INVALID_ARGUMENT when the text is not a JSON object or
// the class not a string.
absl::StatusOr<std::string> ParseTokenizerClass(const std::string& json_text);

class ByteTokenizer {
 public:
  static constexpr uint32_t kPad = 0, kEos = 1, kUnk = 2, kByteOffset = 3;

  // It has no state: ForClass says whether a model uses it.
  ByteTokenizer() = default;

  // The tokenizer of a class (Model::tokenizer_class, ServerInfo.tokenizer):
  // FAILED_PRECONDITION for none (empty), UNIMPLEMENTED for any other than
  // kByteTokenizerClass, INVALID_ARGUMENT for a vocabulary too small for
  // the bytes.
  static absl::StatusOr<ByteTokenizer> ForClass(const std::string& tokenizer_class, int64_t vocab_size);

  // Each byte of the UTF-8 text.
  std::vector<uint32_t> Encode(std::string_view text) const;
  // The bytes of byte ids, special and extra ids left out, with each
  // ill-formed UTF-8 sequence (a cut-off multibyte character) replaced by
  // U+FFFD so the result prints, as Python's errors="replace" does.
  std::string Decode(std::span<const uint32_t> ids) const;
};

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_TOKENIZER_H_
