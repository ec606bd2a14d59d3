// DeepSeek-V4 (v4-tiny: window-only, CSA and HCA layers, a 16-token window,
// HCA ratio 8, hash-routed first layers, hyper-connections) against the
// naive float64 model, which computes a prompt in one pass as model.py's
// prefill does while the engine goes position by position: logits within
// 1e-4 of the largest at every position checked, greedy ids equal, the
// indexer's choices equal where not tied. Prompts cross the window, close
// groups in prefill and in decode, and leave groups open. The naive
// model's mutations (no FP8 rounding, no sinks, no inverse RoPE, every
// compressed entry attended on CSA layers, YaRN on window-only layers)
// must each be caught. Fresh weights and prompts every run.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <utility>

#include "kvtier/kernels/float_formats.h"
#include "kvtier/kernels/qat_rounding.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model.h"
#include "services/runtime/v4_forward.h"
#include "services/runtime/v4_tensors.h"
#include "tests/reference/deepseek_math.h"
#include "tests/reference/naive_model.h"
#include "tests/reference/naive_v4.h"
#include "tests/temp_dir.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

constexpr double kLogitTolerance = 1e-4;

using testing::RelativeError;

template <typename T>
size_t ArgMax(const std::vector<T>& v) {
  return static_cast<size_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// v4-tiny (bf16) and v4-tiny-fp8 (as V4 is released: FP8 projections with
// E8M0 scales, MXFP4 experts, products rounding their inputs to FP8).
class ModelV4Test : public ::testing::TestWithParam<std::string> {
 protected:
  // The preset with fresh weights; its SwiGLU limit lowered so that the
  // clamp binds on these weights.
  void SetUp() override {
    config_ = *PresetConfig(GetParam());
    config_.v4->swiglu_limit = 1.0;
    if (config_.fp8.has_value()) {
      // Fewer products whose inputs the model rounds (see the first test):
      // a CSA and an HCA layer, the first hash-routed, one routed expert.
      config_.num_hidden_layers = 2;
      config_.v4->compress_ratios = {4, 8};
      config_.v4->num_hash_layers = 1;
      config_.num_experts_per_tok = 1;
    }
    ASSERT_TRUE(MakeModel(config_, dir_.path().string(), rng_.seed()).ok());
    auto ckpt = Checkpoint::Open(dir_.path().string());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
    auto model = Model::Load(*ckpt_);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }

  // The naive model over `tokens`, taking the engine's rounding where the
  // two may round either way (at most a few values in a run).
  testing::NaiveV4Result Naive(const std::vector<uint32_t>& tokens, const SequenceCache& cache, const V4Trace& trace) {
    testing::NaiveV4Options options;
    options.engine_trace = &trace;
    options.engine_state = &cache.v4;
    testing::NaiveV4Result naive = testing::NaiveV4Forward(*ckpt_, tokens, options);
    EXPECT_LE(naive.adopted, 8u);
    return naive;
  }

  std::vector<uint32_t> RandomTokens(size_t n) { return rng_.Tokens(n, config_.vocab_size); }

  testing::SeededRng rng_;
  testing::TempDir dir_{"kvtier_model_v4_"};
  ModelConfig config_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<Model> model_;
};

// A prompt in one prefill, then greedy decode steps: each step's logits
// against the naive model's at the same position, the indexer's choices
// at every position. In bf16 a prompt past the window, leaving groups
// open, with steps that close groups of both ratios. With FP8 weights the
// products round their inputs to FP8, so one input that float and double
// round apart sends the two runs apart without either being wrong: short
// runs (a CSA group closing in decode) are drawn until one has no input
// near a rounding boundary, and that one must match as closely.
TEST_P(ModelV4Test, PrefillThenDecodeMatchesTheNaiveModel) {
  SCOPED_TRACE(rng_.Trace());
  const bool fp8 = config_.fp8.has_value();
  const size_t prompt_tokens = fp8 ? 3 : 43, steps = fp8 ? 2 : 7;
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 100) << "every run had an input near an FP8 rounding boundary";
    const std::vector<uint32_t> prompt = RandomTokens(prompt_tokens);
    SequenceCache cache = model_->NewCache(kernels::Codec::kBf16, 64);
    V4Trace trace;
    cache.v4_trace = &trace;
    std::vector<float> logits(config_.vocab_size);
    ASSERT_TRUE(model_->Prefill(prompt, cache, logits).ok());
    std::vector<uint32_t> tokens = prompt;
    std::vector<std::vector<float>> engine = {logits};
    for (size_t i = 0; i < steps; ++i) {
      tokens.push_back(static_cast<uint32_t>(ArgMax(logits)));
      ASSERT_TRUE(model_->Step(tokens.back(), cache, logits).ok());
      engine.push_back(logits);
    }
    const testing::NaiveV4Result naive = Naive(tokens, cache, trace);
    if (naive.ambiguous_inputs > 0) continue;
    for (size_t i = 0; i < engine.size(); ++i) {
      const size_t pos = prompt.size() - 1 + i;
      EXPECT_LT(RelativeError(engine[i], naive.logits[pos]), kLogitTolerance) << "position " << pos;
      EXPECT_EQ(ArgMax(engine[i]), ArgMax(naive.logits[pos])) << "position " << pos;
    }
    size_t compared = 0, csa_layers = 0;
    for (size_t li = 0; li < naive.chosen.size(); ++li) {
      csa_layers += naive.chosen[li].empty() ? 0 : 1;
      if (naive.chosen[li].empty()) continue;
      for (size_t pos = 0; pos + 1 < tokens.size(); ++pos) {
        if (naive.tied[li][pos]) continue;
        EXPECT_EQ(trace.chosen[li][pos], naive.chosen[li][pos]) << "layer " << li << " position " << pos;
        ++compared;
      }
    }
    EXPECT_GT(compared, csa_layers * (tokens.size() - 1) / 2);  // nearly every CSA layer's positions
    return;
  }
}

// The same tokens through passes of several sizes (one token, a few, more
// than the window) and beside another sequence in one batch: the same
// logits as the naive model's at the end of each pass.
TEST_P(ModelV4Test, PassesOfAnySizeAndBatchesMatch) {
  SCOPED_TRACE(rng_.Trace());
  if (config_.fp8.has_value())
    GTEST_SKIP() << "bf16's run covers this (FP8's long runs diverge at rounding boundaries)";
  const std::vector<uint32_t> tokens = RandomTokens(60), other = RandomTokens(23);
  SequenceCache a = model_->NewCache(kernels::Codec::kBf16, 64), b = model_->NewCache(kernels::Codec::kBf16, 64);
  V4Trace trace_a, trace_b;
  a.v4_trace = &trace_a;
  b.v4_trace = &trace_b;
  std::vector<float> la(config_.vocab_size), lb(config_.vocab_size);
  std::vector<std::vector<float>> pass_logits;
  // b's first pass rides in a's batch.
  const std::vector<size_t> cuts = {1, 3, 9, 26, 27, 60};  // pass ends
  size_t begin = 0;
  for (size_t cut : cuts) {
    const std::span<const uint32_t> pass(tokens.data() + begin, cut - begin);
    if (begin == 3) {
      const SequenceTokens batch[] = {{pass, &a, la}, {other, &b, lb}};
      ASSERT_TRUE(model_->Forward(batch).ok());
    } else {
      ASSERT_TRUE(model_->Prefill(pass, a, la).ok());
    }
    pass_logits.push_back(la);
    begin = cut;
  }
  const testing::NaiveV4Result naive = Naive(tokens, a, trace_a);
  for (size_t i = 0; i < cuts.size(); ++i) {
    EXPECT_LT(RelativeError(pass_logits[i], naive.logits[cuts[i] - 1]), kLogitTolerance)
        << "pass ending at " << cuts[i];
  }
  EXPECT_LT(RelativeError(lb, Naive(other, b, trace_b).logits.back()), kLogitTolerance);
}

// Each mutation of the naive model moves its logits away from the engine's
// by far more than the tolerance: the comparisons above would catch an
// engine that made the same mistake.
TEST_P(ModelV4Test, EveryMutationIsCaught) {
  SCOPED_TRACE(rng_.Trace());
  if (config_.fp8.has_value())
    GTEST_SKIP() << "bf16's run covers this (FP8's long runs diverge at rounding boundaries)";
  const std::vector<uint32_t> tokens = RandomTokens(40);
  SequenceCache cache = model_->NewCache(kernels::Codec::kBf16, 64);
  V4Trace trace;
  cache.v4_trace = &trace;
  std::vector<float> logits(config_.vocab_size);
  ASSERT_TRUE(model_->Prefill(tokens, cache, logits).ok());
  ASSERT_LT(RelativeError(logits, Naive(tokens, cache, trace).logits.back()), kLogitTolerance);
  const std::vector<std::pair<std::string, testing::NaiveV4Options>> mutations = {
      {"no FP8 rounding", {.fp8_rounding = false}},
      {"no sinks", {.sinks = false}},
      {"no inverse RoPE", {.inverse_rope = false}},
      {"every compressed entry on CSA layers", {.indexer = false}},
      {"YaRN on window-only layers", {.yarn_on_window = true}},
  };
  for (const auto& [name, options] : mutations) {
    EXPECT_GT(RelativeError(logits, testing::NaiveV4Forward(*ckpt_, tokens, options).logits.back()),
              10 * kLogitTolerance)
        << name;
  }
}

// The checkpoint holds DeepSeek's own names and dtypes, and config.json the
// released fields.
TEST_P(ModelV4Test, CheckpointIsAsPublished) {
  // Layers by kind: v4-tiny's 0 window-only, 1 CSA, 2 HCA; the FP8
  // model's 0 CSA, 1 HCA. The hash-routed layers come first.
  const bool fp8 = config_.fp8.has_value();
  const std::string csa = fp8 ? "layers.0." : "layers.1.", hca = fp8 ? "layers.1." : "layers.2.";
  EXPECT_EQ(ckpt_->Tensor("layers.0.ffn.gate.tid2eid")->dtype, DType::kI32);
  EXPECT_FALSE(ckpt_->Tensor(hca + "ffn.gate.tid2eid").ok());
  EXPECT_EQ(ckpt_->Tensor(hca + "ffn.gate.bias")->dtype, DType::kF32);
  EXPECT_EQ(ckpt_->Tensor(csa + "attn.indexer.compressor.ape")->shape, (std::vector<int64_t>{4, 64}));
  EXPECT_EQ(ckpt_->Tensor(hca + "attn.compressor.ape")->shape, (std::vector<int64_t>{8, 80}));
  EXPECT_FALSE(ckpt_->Tensor(hca + "attn.indexer.compressor.ape").ok());
  EXPECT_EQ(ckpt_->Tensor("layers.1.hc_attn_fn")->shape, (std::vector<int64_t>{24, 4 * config_.hidden_size}));
  const int64_t hidden = config_.hidden_size, inter = config_.moe_intermediate_size;
  if (fp8) {  // as released
    EXPECT_EQ(ckpt_->Tensor("layers.0.attn.wq_a.weight")->dtype, DType::kF8E4m3);
    EXPECT_EQ(ckpt_->Tensor("layers.0.attn.wq_a.scale")->dtype, DType::kF8E8m0);
    EXPECT_EQ(ckpt_->Tensor("layers.0.ffn.shared_experts.w2.weight")->dtype, DType::kF8E4m3);
    EXPECT_EQ(ckpt_->Tensor("layers.1.ffn.experts.7.w2.weight")->dtype, DType::kI8);
    EXPECT_EQ(ckpt_->Tensor("layers.1.ffn.experts.7.w2.weight")->shape, (std::vector<int64_t>{hidden, inter / 2}));
    EXPECT_EQ(ckpt_->Tensor("layers.1.ffn.experts.7.w2.scale")->shape, (std::vector<int64_t>{hidden, inter / 32}));
    EXPECT_EQ(ckpt_->Tensor("layers.1.attn.compressor.wkv.weight")->dtype, DType::kBf16);
  } else {
    EXPECT_FALSE(ckpt_->Tensor("layers.0.attn.compressor.ape").ok());
    EXPECT_EQ(ckpt_->Tensor("layers.4.ffn.experts.7.w2.weight")->shape, (std::vector<int64_t>{hidden, inter}));
  }
  std::ifstream in(dir_ / "config.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["model_type"], "deepseek_v4");
  EXPECT_EQ(j["compress_ratios"], nlohmann::json(config_.v4->compress_ratios));
  EXPECT_EQ(j.contains("quantization_config"), config_.fp8.has_value());
  EXPECT_EQ(j["scoring_func"], "sqrtsoftplus");
}

INSTANTIATE_TEST_SUITE_P(Presets, ModelV4Test, ::testing::Values("v4-tiny", "v4-tiny-fp8"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param == "v4-tiny" ? std::string("Bf16") : std::string("Fp8");
                         });

// A cache built for an MLA model does not fit a V4 one.
TEST_P(ModelV4Test, ACacheOfAnotherModelIsRefused) {
  SequenceCache mla;
  mla.blocks.resize(config_.num_hidden_layers);
  mla.tail.resize(config_.num_hidden_layers);
  std::vector<float> logits(config_.vocab_size);
  const uint32_t token = 1;
  EXPECT_EQ(model_->Prefill(std::span(&token, 1), mla, logits).code(), absl::StatusCode::kInvalidArgument);
}

// An Accelerator on the host, for the wiring that --device cuda uses
// (cuda_accelerator.h) where no GPU is: each placed matrix is kept as it was
// and multiplied by the CPU's own products, so a pass must give the CPU
// backend's bits exactly. It counts what was placed, and fails every
// product from the `fail_from`th on.
class HostAccelerator final : public Accelerator {
 public:
  class Matrix final : public DeviceMatrix {
   public:
    Matrix(HostAccelerator* device, WeightMatrix w) : device_(device), w_(std::move(w)) {}
    void Multiply(size_t row_begin, size_t rows, size_t cols, const float* x, size_t n, size_t x_stride, float* y,
                  size_t y_stride) const override {
      if (device_->products_.fetch_add(1) >= device_->fail_from) {
        for (size_t i = 0; i < n; ++i) std::fill_n(y + i * y_stride, rows, NAN);
        std::lock_guard lock(device_->mu_);
        if (device_->error_.ok()) device_->error_ = absl::DataLossError("the test's device failed a product");
        return;
      }
      if (row_begin == 0 && x_stride == cols && y_stride == rows) return MatMul(w_, rows, cols, x, n, y);
      MatMulRows(w_, row_begin, rows, cols, x, n, x_stride, y, y_stride);
    }
    bool quantized() const override { return w_.quantized(); }

   private:
    HostAccelerator* const device_;
    const WeightMatrix w_;
  };

  absl::Status Place(WeightMatrix& w, size_t cols) override {
    if (cols == 0 || w.values() % cols != 0) return absl::InternalError("not whole rows");
    auto placed = std::make_shared<Matrix>(this, std::move(w));
    w = WeightMatrix{};
    w.device = std::move(placed);
    ++placed_;
    return absl::OkStatus();
  }
  absl::Status TakeError() override {
    std::lock_guard lock(mu_);
    return std::exchange(error_, absl::OkStatus());
  }
  absl::Status ChooseKeys(const IndexerQueries& queries, std::vector<std::vector<uint32_t>>& chosen) override {
    ++choices_;
    ChooseKeysOnCpu(queries, chosen);
    return absl::OkStatus();
  }
  absl::Status SinkAttention(const kernels::SinkAttentionShape& shape, std::span<const std::vector<float>> entries,
                             const float* q, const float* sinks, float* out) override {
    ++attentions_;
    SinkAttentionOnCpu(shape, entries, q, sinks, out);
    return absl::OkStatus();
  }

  size_t placed_ = 0, choices_ = 0, attentions_ = 0;
  std::atomic<size_t> products_ = 0;
  size_t fail_from = SIZE_MAX;

 private:
  std::mutex mu_;
  absl::Status error_;
};

// The products, indexer and attention moved to an accelerator: every matrix but
// the embedding goes there, a batched prefill and decode steps give the
// CPU's logits and state bit for bit (so each product took its rows,
// strides and rounding of inputs as on the CPU, the indexer each row's
// query and visible keys, and attention its rows' entries), and a product
// that fails fails the pass with the accelerator's error, never logits.
TEST_P(ModelV4Test, AnAcceleratorGivesTheCpuBitsAndFailsLoudly) {
  SCOPED_TRACE(rng_.Trace());
  auto device = std::make_unique<HostAccelerator>();
  HostAccelerator& products = *device;
  auto backend = LoadV4Forward(*ckpt_, std::move(device));
  ASSERT_TRUE(backend.ok()) << backend.status();
  size_t matrices = 1;  // the head
  for (int64_t ratio : config_.v4->compress_ratios) {
    matrices += 5 + (ratio > 0 ? 2 : 0) + (ratio == 4 ? 4 : 0);  // attention, compressor, indexer
    matrices += 3 * static_cast<size_t>(config_.n_routed_experts + (config_.n_shared_experts > 0 ? 1 : 0));
  }
  EXPECT_EQ(products.placed_, matrices);

  const size_t vocab = config_.vocab_size;
  const std::vector<std::vector<uint32_t>> prompts = {RandomTokens(37), RandomTokens(5)};
  std::vector<SequenceCache> on_cpu, on_device;
  std::vector<std::vector<float>> cpu_logits(prompts.size(), std::vector<float>(vocab)), device_logits = cpu_logits;
  for (size_t s = 0; s < prompts.size(); ++s) {
    on_cpu.push_back(model_->NewCache(kernels::Codec::kBf16, 64));
    on_device.push_back(model_->NewCache(kernels::Codec::kBf16, 64));
  }
  const auto pass = [&](const std::vector<std::vector<uint32_t>>& tokens) {
    std::vector<SequenceTokens> cpu_batch, device_batch;
    for (size_t s = 0; s < tokens.size(); ++s) {
      cpu_batch.push_back({tokens[s], &on_cpu[s], cpu_logits[s]});
      device_batch.push_back({tokens[s], &on_device[s], device_logits[s]});
    }
    const absl::Status cpu = model_->Forward(cpu_batch);
    EXPECT_TRUE(cpu.ok()) << cpu;
    return (*backend)->Forward(device_batch, nullptr);
  };
  std::vector<std::vector<uint32_t>> tokens = prompts;
  for (int step = 0; step < 4; ++step) {
    const absl::Status done = pass(tokens);
    ASSERT_TRUE(done.ok()) << done;
    for (size_t s = 0; s < prompts.size(); ++s) {
      SCOPED_TRACE("pass " + std::to_string(step) + ", sequence " + std::to_string(s));
      EXPECT_EQ(device_logits[s], cpu_logits[s]);
      EXPECT_EQ(on_device[s].length, on_cpu[s].length);
      for (size_t li = 0; li < on_cpu[s].v4.size(); ++li) {
        EXPECT_EQ(on_device[s].v4[li].window, on_cpu[s].v4[li].window) << "layer " << li;
        EXPECT_EQ(on_device[s].v4[li].compressed, on_cpu[s].v4[li].compressed) << "layer " << li;
        EXPECT_EQ(on_device[s].v4[li].index_keys, on_cpu[s].v4[li].index_keys) << "layer " << li;
      }
      tokens[s] = {static_cast<uint32_t>(ArgMax(cpu_logits[s]))};
    }
  }
  EXPECT_GT(products.products_.load(), 0u);
  EXPECT_EQ(products.attentions_, 4 * config_.v4->compress_ratios.size());  // a call a layer a pass
  const size_t csa_layers = std::count(config_.v4->compress_ratios.begin(), config_.v4->compress_ratios.end(), 4);
  EXPECT_EQ(products.choices_, 4 * csa_layers);
  products.fail_from = products.products_.load() + 7;
  const absl::Status failed = pass(tokens);
  EXPECT_EQ(failed.code(), absl::StatusCode::kDataLoss) << failed;
  EXPECT_TRUE(products.TakeError().ok()) << "the pass took the error";
}

// The model's FP8 and FP4 rounding against values found by trying every
// code, on fresh random blocks at random magnitudes.
TEST(QatRoundingTest, MatchesTheNearestCodeTimesAPowerOfTwoScale) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> exponent(-30, 30);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<float> x(64);
    const float magnitude = std::ldexp(1.0f, exponent(rng.engine()));
    for (float& v : x) v = normal(rng.engine()) * magnitude;
    std::vector<float> fp8 = x, fp4 = x;
    kernels::RoundThroughFp8(fp8, 64);
    kernels::RoundThroughFp4(fp4, 32);
    float amax = 1e-4f;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const double scale8 = std::exp2(std::ceil(std::log2(amax * (1.0f / 448.0f))));
    for (size_t i = 0; i < x.size(); ++i) {
      const double code = kernels::ReferenceE4m3Value(kernels::ReferenceNearestE4m3(x[i] / scale8));
      EXPECT_EQ(fp8[i], static_cast<float>(code * scale8)) << i;
    }
    for (size_t block = 0; block < 2; ++block) {
      float amax4 = 6.0f * std::ldexp(1.0f, -126);
      for (size_t i = 0; i < 32; ++i) amax4 = std::max(amax4, std::fabs(x[block * 32 + i]));
      const double scale4 = std::exp2(std::ceil(std::log2(amax4 * (1.0f / 6.0f))));
      for (size_t i = block * 32; i < block * 32 + 32; ++i) {
        // The grid's codes in order; a tie goes to the even one.
        static constexpr double kGrid[] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
        const double target = std::fabs(x[i] / scale4);
        int code = 0;
        for (int c = 1; c < 8; ++c) {
          const double d = std::fabs(kGrid[c] - target), b = std::fabs(kGrid[code] - target);
          if (d < b || (d == b && c % 2 == 0)) code = c;
        }
        const double best = kGrid[code];
        EXPECT_EQ(fp4[i], static_cast<float>(std::copysign(best, x[i]) * scale4)) << i;
      }
    }
  }
  // Ties go to the even code (scale 1 where amax is 448).
  std::vector<float> ties(64, 0.0f);
  ties[0] = 448.0f;
  ties[1] = 8.5f;
  ties[2] = -9.5f;
  kernels::RoundThroughFp8(ties, 64);
  EXPECT_EQ(ties[1], 8.0f);
  EXPECT_EQ(ties[2], -10.0f);
  EXPECT_EQ(kernels::RoundToE2m1(0.25f), 0.0f);
  EXPECT_EQ(kernels::RoundToE2m1(0.75f), 1.0f);
  EXPECT_EQ(kernels::RoundToE2m1(1.25f), 1.0f);
  EXPECT_EQ(kernels::RoundToE2m1(2.5f), 2.0f);
  EXPECT_EQ(kernels::RoundToE2m1(3.5f), 4.0f);
  EXPECT_EQ(kernels::RoundToE2m1(-5.0f), -4.0f);
}

}  // namespace
}  // namespace kvtier::runtime
