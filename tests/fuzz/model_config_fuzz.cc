// ParseModelConfig, on a checkpoint's config.json (any file an operator
// points kvtier at): it refuses what it cannot run with an error, and a
// config it accepts writes out (ToJson) as text it reads back to the same
// config. Input: the JSON text.
#include <string>
#include <vector>

#include "services/runtime/make_model.h"
#include "services/runtime/model_config.h"
#include "tests/fuzz/fuzz_target.h"

namespace kvtier::fuzz {

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  for (const char* preset : {"tiny", "lite-attn", "v3-tiny", "kimi-k2-tiny", "v32-tiny", "v4-tiny", "v4-tiny-fp8"}) {
    seeds.push_back(runtime::PresetConfig(preset)->ToJson());
  }
  return seeds;
}

}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::runtime;
  const absl::StatusOr<ModelConfig> config = ParseModelConfig(std::string(reinterpret_cast<const char*>(data), size));
  if (!config.ok()) return 0;
  const std::string text = config->ToJson();
  const absl::StatusOr<ModelConfig> again = ParseModelConfig(text);
  KVTIER_FUZZ_CHECK(again.ok());
  KVTIER_FUZZ_CHECK(again->ToJson() == text);
  return 0;
}
