// --device cuda against the CPU backend (label gpu; skipped, saying so,
// without a GPU). The GPU multiplies bf16 weights by activations rounded to
// bf16 (8 significant bits) and sums in float32; the CPU multiplies the
// same weights by float32 activations. Bound: logits within 3e-2 of the
// largest |logit| of their row, at every step of a batched prefill and of
// batched decode steps, for each preset with dense layers only; with MoE
// layers, for the median row (a token whose gate logits nearly tie may pick
// another expert on the GPU: that moves its row by more, and is not a bug;
// the MoE itself is checked against float64 in kernels/cuda/check_matmul).
// The blocks each backend seals: equal in number.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "kvtier/kernels/cuda_codec.h"
#include "services/common/child_process.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model.h"
#include "tests/binary_path.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

namespace fs = std::filesystem;

constexpr double kLogitTolerance = 3e-2;

double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, mag = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(double{got[i]} - want[i]));
    mag = std::max(mag, std::fabs(double{want[i]}));
  }
  return diff / mag;
}

struct Variant {
  std::string name, preset;
  bool dense_only;  // every layer a dense MLP: no gate to tip over
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class CudaForwardTest : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    std::string why;
    if (!kernels::cuda::DevicePresent(&why)) GTEST_SKIP() << "no GPU (" << why << "): --device cuda not run";
  }
  void TearDown() override { fs::remove_all(dir_); }
  testing::SeededRng rng_;
  fs::path dir_ = fs::temp_directory_path() / ("kvtier_cuda_forward_" + std::to_string(rng_.seed()));
};

// Three sequences stored in three codecs, prefilled as one batch (prompts
// crossing block boundaries), then eight decode steps as one batch, each
// fed the CPU's greedy token on both backends.
TEST_P(CudaForwardTest, LogitsMatchTheCpuThroughPrefillAndDecode) {
  SCOPED_TRACE(rng_.Trace());
  ModelConfig config = *PresetConfig(GetParam().preset);
  if (GetParam().dense_only) config.first_k_dense_replace = config.num_hidden_layers;
  ASSERT_TRUE(MakeModel(config, dir_.string(), rng_.seed()).ok());
  auto ckpt = Checkpoint::Open(dir_.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto cpu = Model::Load(**ckpt, Device::kCpu);
  auto gpu = Model::Load(**ckpt, Device::kCuda);
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << " " << gpu.status();

  const size_t vocab = static_cast<size_t>(config.vocab_size);
  std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(vocab - 1));
  const std::vector<kernels::Codec> codecs = {kernels::Codec::kInt8, kernels::Codec::kBf16, kernels::Codec::kInt4};
  const std::vector<size_t> prompt_lengths = {37, 70, 5};
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<SequenceCache> cpu_caches, gpu_caches;
  for (size_t s = 0; s < codecs.size(); ++s) {
    prompts.emplace_back(prompt_lengths[s]);
    for (uint32_t& t : prompts.back()) t = id(rng_.engine());
    cpu_caches.push_back((*cpu)->NewCache(codecs[s], 16));
    gpu_caches.push_back((*gpu)->NewCache(codecs[s], 16));
  }
  std::vector<std::vector<float>> cpu_logits(codecs.size(), std::vector<float>(vocab)), gpu_logits = cpu_logits;
  auto run = [&](const Model& model, std::vector<SequenceCache>& caches, std::vector<std::vector<float>>& logits,
                 const std::vector<std::vector<uint32_t>>& tokens) {
    std::vector<SequenceTokens> batch;
    for (size_t s = 0; s < caches.size(); ++s) batch.push_back({tokens[s], &caches[s], logits[s]});
    return model.Forward(batch);
  };
  ASSERT_TRUE(run(**cpu, cpu_caches, cpu_logits, prompts).ok());
  const absl::Status prefill = run(**gpu, gpu_caches, gpu_logits, prompts);
  ASSERT_TRUE(prefill.ok()) << prefill;
  std::vector<double> errors;
  for (int step = 0;; ++step) {
    for (size_t s = 0; s < codecs.size(); ++s) {
      SCOPED_TRACE("step " + std::to_string(step) + ", sequence " + std::to_string(s));
      errors.push_back(RelativeError(gpu_logits[s], cpu_logits[s]));
      if (GetParam().dense_only) {
        EXPECT_LE(errors.back(), kLogitTolerance);
      }
      EXPECT_EQ(gpu_caches[s].length, cpu_caches[s].length);
      for (size_t l = 0; l < cpu_caches[s].blocks.size(); ++l) {
        EXPECT_EQ(gpu_caches[s].blocks[l].size(), cpu_caches[s].blocks[l].size());
        EXPECT_EQ(gpu_caches[s].tail[l].size(), cpu_caches[s].tail[l].size());
      }
    }
    if (step == 8 || HasFailure()) break;
    std::vector<std::vector<uint32_t>> next;
    for (const std::vector<float>& l : cpu_logits) {
      next.push_back({static_cast<uint32_t>(std::max_element(l.begin(), l.end()) - l.begin())});
    }
    ASSERT_TRUE(run(**cpu, cpu_caches, cpu_logits, next).ok());
    ASSERT_TRUE(run(**gpu, gpu_caches, gpu_logits, next).ok());
  }
  std::nth_element(errors.begin(), errors.begin() + errors.size() / 2, errors.end());
  EXPECT_LE(errors[errors.size() / 2], kLogitTolerance) << "median row";
}

INSTANTIATE_TEST_SUITE_P(Presets, CudaForwardTest,
                         ::testing::Values(Variant{"tiny", "tiny", false}, Variant{"tiny_dense", "tiny", true},
                                           Variant{"lite_attn", "lite-attn", false},
                                           Variant{"lite_attn_dense", "lite-attn", true}),
                         [](const auto& info) { return info.param.name; });

// The end-to-end check: `kvtier run --device cuda` prints the same
// greedy ids as `--device cpu` on the lite-attn preset (int8 blocks of 64:
// the tensor-core attention kernel).
TEST(CudaForwardCli, KvtierRunOnCudaPrintsTheCpuIds) {
  std::string why;
  if (!kernels::cuda::DevicePresent(&why)) GTEST_SKIP() << "no GPU (" << why << "): kvtier run --device cuda not run";
  testing::SeededRng rng;
  const fs::path dir = fs::temp_directory_path() / ("kvtier_cuda_run_" + std::to_string(rng.seed()));
  ASSERT_TRUE(MakeModel(*PresetConfig("lite-attn"), dir.string(), rng.seed()).ok());
  std::string prompt;
  std::uniform_int_distribution<uint32_t> id(0, 1023);
  for (int i = 0; i < 150; ++i) prompt += (i ? "," : "") + std::to_string(id(rng.engine()));
  const std::string command = testing::BinaryPath("KVTIER_BINARY", KVTIER_BINARY) + " run --model " + dir.string() + " --prompt-ids " + prompt +
                              " --max-new-tokens 8 --kv-codec int8 --device ";
  const auto on_cpu = RunCommand(command + "cpu");
  const auto on_gpu = RunCommand(command + "cuda");
  EXPECT_EQ(on_cpu.exit_code, 0) << on_cpu.output;
  EXPECT_EQ(on_gpu.exit_code, 0) << on_gpu.output;
  EXPECT_EQ(on_gpu.output, on_cpu.output) << rng.Trace();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::runtime
