// RestoreV4, on the DeepSeek-V4 blocks and restore point a decode worker
// reads from the cache (bytes a client Put there): it refuses what does
// not fit, leaving the cache empty, and a restore it accepts holds only
// finite values the formats hold (cut again, then restored, it cuts to
// the same bytes). The model is make-model's v4-tiny, made once. Input:
// the number of blocks (1-3), then the blocks and the restore point after
// them, each of its size.
#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model.h"
#include "services/runtime/v4_cache_parts.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/temp_dir.h"

namespace kvtier::fuzz {
namespace {

constexpr uint32_t kBlock = 16;  // a multiple of v4-tiny's ratios (4, 8)

const runtime::Model& TinyV4() {
  static const std::unique_ptr<runtime::Model> model = [] {
    const runtime::ModelConfig config = *runtime::PresetConfig("v4-tiny");
    const testing::TempDir dir("kvtier_fuzz_v4_");  // removed once the weights are loaded
    if (!runtime::MakeModel(config, dir.path().string(), 1).ok()) std::abort();
    const std::unique_ptr<runtime::Checkpoint> checkpoint = *runtime::Checkpoint::Open(dir.path().string());
    std::unique_ptr<runtime::Model> loaded = *runtime::Model::Load(*checkpoint);
    return loaded;
  }();
  return *model;
}

// A restored sequence's n blocks and its restore point, as a worker would
// store them again; every one must encode.
std::vector<std::vector<uint8_t>> Cut(const runtime::ModelConfig& config, const runtime::SequenceCache& cache,
                                      size_t n) {
  std::vector<std::vector<uint8_t>> parts;
  for (size_t b = 0; b < n; ++b) {
    absl::StatusOr<std::vector<uint8_t>> block = runtime::EncodeV4Block(config, cache, b, kBlock);
    KVTIER_FUZZ_CHECK(block.ok());
    parts.push_back(*std::move(block));
  }
  absl::StatusOr<std::vector<uint8_t>> point = runtime::EncodeV4RestorePoint(config, cache, kBlock);
  KVTIER_FUZZ_CHECK(point.ok());
  parts.push_back(*std::move(point));
  return parts;
}

}  // namespace

std::vector<std::string> Seeds() {
  const runtime::Model& model = TinyV4();
  std::mt19937_64 rng(1);
  std::vector<std::string> seeds;
  for (size_t n = 1; n <= 3; ++n) {
    runtime::SequenceCache cache = model.NewCache(kernels::Codec::kBf16, kBlock);
    std::vector<uint32_t> tokens(n * kBlock);
    for (uint32_t& t : tokens) t = static_cast<uint32_t>(rng() % model.config().vocab_size);
    std::vector<float> logits(model.config().vocab_size);
    if (!model.Prefill(tokens, cache, logits).ok()) std::abort();
    std::string seed(1, static_cast<char>(n - 1));
    for (size_t b = 0; b < n; ++b) {
      const std::vector<uint8_t> block = *runtime::EncodeV4Block(model.config(), cache, b, kBlock);
      seed.append(block.begin(), block.end());
    }
    const std::vector<uint8_t> point = *runtime::EncodeV4RestorePoint(model.config(), cache, kBlock);
    seed.append(point.begin(), point.end());
    seeds.push_back(seed);
  }
  return seeds;
}

}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::runtime;
  using kvtier::fuzz::Cut, kvtier::fuzz::kBlock;
  if (size < 1) return 0;
  const Model& model = kvtier::fuzz::TinyV4();
  const ModelConfig& config = model.config();
  const size_t n = 1 + data[0] % 3, block_bytes = V4BlockBytes(config, kBlock);
  const size_t point_bytes = V4RestorePointBytes(config, static_cast<int64_t>(n * kBlock));
  if (size - 1 < n * block_bytes + point_bytes) return 0;
  std::vector<std::span<const uint8_t>> blocks;
  for (size_t b = 0; b < n; ++b) blocks.emplace_back(data + 1 + b * block_bytes, block_bytes);
  const std::span<const uint8_t> point(data + 1 + n * block_bytes, point_bytes);
  SequenceCache cache = model.NewCache(kvtier::kernels::Codec::kBf16, kBlock);
  if (!RestoreV4(config, blocks, point, kBlock, cache).ok()) {
    KVTIER_FUZZ_CHECK(cache.length == 0);
    return 0;
  }
  KVTIER_FUZZ_CHECK(cache.length == static_cast<int64_t>(n * kBlock));
  // Only finite values: a NaN or infinity would spread through every later
  // step of the sequence.
  const auto finite = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
  };
  for (const V4LayerState& layer : cache.v4) {
    KVTIER_FUZZ_CHECK(finite(layer.window) && finite(layer.compressed) && finite(layer.index_keys));
    for (const V4CompressorState* s : {&layer.compressor, &layer.index_compressor}) {
      KVTIER_FUZZ_CHECK(finite(s->kv) && finite(s->score) && finite(s->previous_kv) && finite(s->previous_score));
    }
  }
  // Cut again: parts the formats hold (every value finite and on its
  // grid), which restore to a state that cuts to the same bytes. (Not
  // always the bytes restored from: a block of zeros under any scale reads
  // as the same values.)
  const std::vector<std::vector<uint8_t>> again = Cut(config, cache, n);
  std::vector<std::span<const uint8_t>> again_blocks(again.begin(), again.end() - 1);
  SequenceCache second = model.NewCache(kvtier::kernels::Codec::kBf16, kBlock);
  KVTIER_FUZZ_CHECK(RestoreV4(config, again_blocks, again.back(), kBlock, second).ok());
  KVTIER_FUZZ_CHECK(Cut(config, second, n) == again);
  return 0;
}
