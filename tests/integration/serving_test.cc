// Prefill node, decode workers and cache shards as users run them: the real
// binaries on port 0, a real gRPC client, outputs compared with the
// in-process runtime (what `kvtier run` prints) on the same checkpoint.
// Over 600 lines: one generated checkpoint and cluster for every case.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "kvtier/v1/decode.grpc.pb.h"
#include "kvtier/v1/prefill.grpc.pb.h"
#if KVTIER_RUNTIME_CUDA
#include "kvtier/kernels/cuda_codec.h"
#endif
#include "services/base/child_process.h"
#include "services/base/metrics_page.h"
#include "services/cache/client/cache_client.h"
#include "services/cache/client/shard_set.h"
#include "services/cli/remote_generate.h"
#include "services/rpc/client_identity.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/generate.h"
#include "services/runtime/make_model.h"
#include "services/serving/request_checks.h"
#include "services/serving/sequence_blocks.h"
#include "services/serving/v4_records.h"
#include "tests/eventually.h"
#include "tests/integration/cluster.h"
#include "tests/integration/prometheus_server.h"
#include "tests/integration/test_tenants.h"
#include "tests/temp_dir.h"
#include "tests/test_random.h"

namespace kvtier {
namespace {

namespace fs = std::filesystem;
using cli::RemoteGeneration;

constexpr uint32_t kBlock = kClusterBlock;  // the prefill node's blocks

// One tiny checkpoint (q_lora, YaRN, group-limited routing, a shared
// expert, a dense first layer) for the whole test binary.
struct TestModel {
  std::string dir;
  std::unique_ptr<runtime::Checkpoint> checkpoint;
  std::unique_ptr<runtime::Model> model;
};

const TestModel& Tiny() {
  static const TestModel* m = [] {
    auto* t = new TestModel;
    t->dir = (fs::temp_directory_path() / ("kvtier_serving_model_" + std::to_string(getpid()))).string();
    if (!runtime::MakeModel(*runtime::PresetConfig("tiny"), t->dir, 5).ok()) std::abort();
    t->checkpoint = std::move(*runtime::Checkpoint::Open(t->dir));
    t->model = std::move(*runtime::Model::Load(*t->checkpoint));
    std::atexit([] { fs::remove_all(Tiny().dir); });
    return t;
  }();
  return *m;
}

// Tokens from `logits` (after the last token in `cache`) on, as
// runtime::Generate draws them (greedy unless `sampling` says otherwise).
std::vector<runtime::Sampled> DecodeFrom(runtime::SequenceCache& cache, std::vector<float> logits, uint32_t max_new,
                                         const runtime::Sampling& sampling = {}) {
  std::vector<runtime::Sampled> out;
  for (uint32_t i = 0; i < max_new; ++i) {
    out.push_back(runtime::Sample(logits, sampling, i, 5));
    if (i + 1 < max_new && !Tiny().model->Step(out.back().token, cache, logits).ok()) std::abort();
  }
  return out;
}

// Generation after `prompt` continuing `cache` (which holds the latents of
// a prefix of it): the rest of the prompt in one pass, then decode steps,
// as runtime::Generate does.
std::vector<runtime::Sampled> Continue(runtime::SequenceCache cache, const std::vector<uint32_t>& prompt,
                                       uint32_t max_new, const runtime::Sampling& sampling = {}) {
  std::vector<float> logits(Tiny().model->config().vocab_size);
  if (!Tiny().model->Prefill(std::span(prompt).subspan(cache.length), cache, logits).ok()) std::abort();
  return DecodeFrom(cache, std::move(logits), max_new, sampling);
}

// What the services must compute when the cache supplied the first
// `cached` tokens' blocks, each made by a prefill from scratch: those tokens
// in one pass, the rest in another. With cached = 0 this is `kvtier run`.
std::vector<runtime::Sampled> InProcess(const std::vector<uint32_t>& prompt, uint32_t max_new, size_t cached = 0,
                                        const runtime::Sampling& sampling = {}) {
  const runtime::Model& model = *Tiny().model;
  runtime::SequenceCache cache = model.NewCache(kernels::Codec::kBf16, kBlock);
  if (cached > 0) {
    std::vector<float> logits(model.config().vocab_size);
    if (!model.Prefill(std::span(prompt).first(cached), cache, logits).ok()) std::abort();
  }
  return Continue(std::move(cache), prompt, max_new, sampling);
}

// What decode computes when its blocks come from two prefills of `prompt`:
// block b from one pass over the whole prompt where `one_pass[b]`, else
// from the pass that followed a cache hit of `cached` tokens, which also
// gives the tail and token 0.
std::vector<runtime::Sampled> MixedInProcess(const std::vector<uint32_t>& prompt, uint32_t max_new, size_t cached,
                                             const std::vector<bool>& one_pass) {
  const runtime::Model& model = *Tiny().model;
  std::vector<float> logits(model.config().vocab_size), after_hit(model.config().vocab_size);
  runtime::SequenceCache whole = model.NewCache(kernels::Codec::kBf16, kBlock);
  if (!model.Prefill(prompt, whole, logits).ok()) std::abort();
  runtime::SequenceCache split = model.NewCache(kernels::Codec::kBf16, kBlock);
  if (cached > 0 && !model.Prefill(std::span(prompt).first(cached), split, logits).ok()) std::abort();
  if (!model.Prefill(std::span(prompt).subspan(cached), split, after_hit).ok()) std::abort();
  for (size_t l = 0; l < split.blocks.size(); ++l) {
    for (size_t b = 0; b < split.blocks[l].size(); ++b) {
      if (one_pass[b]) split.blocks[l][b] = whole.blocks[l][b];
    }
  }
  return DecodeFrom(split, std::move(after_hit), max_new);
}

// Same ids; logprobs (chosen and top-5) within `tolerance`.
void ExpectSameGeneration(const std::vector<runtime::Sampled>& got, const std::vector<runtime::Sampled>& want,
                          double tolerance) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].token, want[i].token) << "token " << i;
    EXPECT_NEAR(got[i].logprob, want[i].logprob, tolerance) << "token " << i;
    ASSERT_EQ(got[i].top.size(), want[i].top.size());
    for (size_t k = 0; k < want[i].top.size(); ++k) {
      EXPECT_EQ(got[i].top[k].first, want[i].top[k].first) << "token " << i << " top " << k;
      EXPECT_NEAR(got[i].top[k].second, want[i].top[k].second, tolerance) << "token " << i << " top " << k;
    }
  }
}

// Value of the sample `series` on the /metrics page at `address`; -1 when
// absent.
double Scrape(const std::string& address, const std::string& series) {
  return MetricValue(ScrapeMetrics(address), series).value_or(-1.0);
}

// On the metrics page of a cache behind a tenants file, the service
// "kvtier" holds no block and read none for itself: all it did, it did
// for an end tenant.
void ExpectNothingIsTheServices(const std::string& page) {
  for (const char* series :
       {R"(kvtier_cache_tenant_used_bytes{tenant="kvtier",tier="device"})",
        R"(kvtier_cache_tenant_hits_total{tenant="kvtier"})", R"(kvtier_cache_tenant_misses_total{tenant="kvtier"})"}) {
    EXPECT_LE(MetricValue(page, series).value_or(0), 0) << series << "\n" << page;
  }
}

std::vector<uint32_t> RandomIds(size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<uint32_t> id(0, 255);
  std::vector<uint32_t> ids(n);
  for (auto& v : ids) v = id(rng);
  return ids;
}

// Hands `data` to a decode request as block `index`'s record.
void AddInlineBlock(v1::DecodeRequest& r, uint32_t index, const std::string& data) {
  v1::InlineBlock* b = r.add_inline_blocks();
  b->set_block_index(index);
  b->set_data(data);
}

v1::GenerateRequest Request(const std::vector<uint32_t>& prompt, uint32_t max_new, const std::string& ns = "") {
  v1::GenerateRequest r;
  r.set_kv_namespace(ns);
  for (uint32_t t : prompt) r.add_prompt_token_ids(t);
  r.mutable_limits()->set_max_new_tokens(max_new);
  r.mutable_limits()->set_top_logprobs(5);
  return r;
}

// `kvtier run --json` on `model_dir` and `kvtier generate --json` through
// the prefill node at `target`, for `prompt`: both print the same JSON
// (their last line; stderr comes first), with 9 significant digits, so
// equal text means equal to ~1e-8. Returns it.
std::string ExpectGenerateAsRun(const std::string& model_dir, const std::string& target,
                                const std::vector<uint32_t>& prompt, uint32_t max_new) {
  std::string ids;
  for (uint32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  const std::string common = " --prompt-ids " + ids + " --max-new-tokens " + std::to_string(max_new) + " --json";
  const CommandResult run = RunCommand(std::string(KVTIER_BINARY) + " run --model " + model_dir + common);
  const CommandResult generate = RunCommand(std::string(KVTIER_BINARY) + " generate --target " + target + common);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(generate.exit_code, 0) << generate.output;
  auto last_line = [](const std::string& s) { return s.substr(s.rfind('\n', s.size() - 2) + 1); };
  EXPECT_EQ(last_line(generate.output), last_line(run.output));
  return last_line(run.output);
}

// Changes one byte (whatever it was: a fixed value could be the same) of
// every block file under the disk tier `disk`, at the offset `at` picks for
// the file's size; how many files it changed.
size_t CorruptDiskBlocks(const fs::path& disk, const std::function<std::streamoff(uintmax_t size)>& at) {
  size_t corrupted = 0;
  for (const auto& e : fs::recursive_directory_iterator(disk)) {
    if (e.path().extension() != ".kvb") continue;
    const std::streamoff offset = at(fs::file_size(e.path()));
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(offset);
    const char was = static_cast<char>(f.get());
    f.seekp(offset);
    f.put(static_cast<char>(was ^ 0x5a));
    ++corrupted;
  }
  return corrupted;
}

class ServingTest : public ::testing::Test {
 protected:
  testing::SeededRng rng_;
};

// Prompts around the block size and a long one, generations crossing block
// boundaries: every id, logprob and top-5 as in process, with no cache hit.
TEST_F(ServingTest, GenerationsEqualTheInProcessRuntime) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  for (size_t length : {1, 63, 64, 65, 300}) {
    SCOPED_TRACE("prompt of " + std::to_string(length));
    const std::vector<uint32_t> prompt = RandomIds(length, rng_.engine());
    absl::StatusOr<RemoteGeneration> got = cluster.Generate(Request(prompt, 70));
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameGeneration(got->tokens, InProcess(prompt, 70), 1e-4);
    EXPECT_EQ(got->reason, v1::FINISH_REASON_LENGTH);
    EXPECT_EQ(got->usage.prompt_tokens(), length);
    EXPECT_EQ(got->usage.cached_tokens(), 0u);
    EXPECT_EQ(got->usage.generated_tokens(), 70u);
    EXPECT_GT(got->usage.time_to_first_token_us(), 0u);
  }
}

// What `model` generates greedily (with top-5 logprobs) after `prompt` when
// the cache supplied its first `cached` tokens' blocks: those tokens in one
// pass, the rest in another, then decode steps.
std::vector<runtime::Sampled> GreedyAfter(const runtime::Model& model, const std::vector<uint32_t>& prompt,
                                          size_t cached, uint32_t max_new) {
  runtime::SequenceCache cache = model.NewCache(kernels::Codec::kBf16, kBlock);
  std::vector<float> logits(static_cast<size_t>(model.config().vocab_size));
  if (cached > 0 && !model.Prefill(std::span(prompt).first(cached), cache, logits).ok()) std::abort();
  if (!model.Prefill(std::span(prompt).subspan(cached), cache, logits).ok()) std::abort();
  std::vector<runtime::Sampled> out;
  for (uint32_t i = 0; i < max_new; ++i) {
    out.push_back(runtime::Sample(logits, {}, i, 5));
    if (i + 1 < max_new && !model.Step(out.back().token, cache, logits).ok()) std::abort();
  }
  return out;
}

// A checkpoint of `preset` in a fresh directory, and its model loaded.
struct PresetModel {
  explicit PresetModel(const std::string& preset, uint64_t seed) : temp("kvtier_serving_" + preset) {
    config = *runtime::PresetConfig(preset);
    if (!runtime::MakeModel(config, dir(), seed, runtime::PublishedShards(config)).ok()) std::abort();
    checkpoint = std::move(*runtime::Checkpoint::Open(dir()));
    model = std::move(*runtime::Model::Load(*checkpoint));
  }
  std::string dir() const { return temp.path().string(); }

  testing::TempDir temp;
  runtime::ModelConfig config;
  std::unique_ptr<runtime::Checkpoint> checkpoint;
  std::unique_ptr<runtime::Model> model;
};

// The V3 family (FP8 weights, the noaux_tc router, sharded checkpoints)
// through the real services: `kvtier generate` prints what `kvtier run`
// prints, and a second turn that hits the cache's blocks generates what the
// runtime computes over the same stored prefix.
TEST_F(ServingTest, TheV3FamilyServesWhatTheRuntimeComputes) {
  SCOPED_TRACE(rng_.Trace());
  for (const char* preset : {"v3-tiny", "kimi-k2-tiny"}) {
    SCOPED_TRACE(preset);
    const PresetModel m(preset, rng_.seed());
    Cluster cluster(m.dir(), 1, 1);
    ASSERT_TRUE(cluster.ok());
    const std::vector<uint32_t> prompt = RandomIds(2 * kBlock + 5, rng_.engine());
    ExpectGenerateAsRun(m.dir(), cluster.prefill_target, prompt, 12);

    absl::StatusOr<RemoteGeneration> hit = cluster.Generate(Request(prompt, 12));
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_EQ(hit->usage.cached_tokens(), 2 * kBlock);
    ExpectSameGeneration(hit->tokens, GreedyAfter(*m.model, prompt, 2 * kBlock, 12), 1e-4);
  }
}

// DeepSeek-V3.2 (top-k 8: every prompt here attends sparsely) through the
// services: its blocks carry the indexer keys, so a turn that hits the
// cache chooses the same tokens and generates what the runtime computes
// over the same stored prefix; a block whose indexer part is damaged on
// disk is a miss (DATA_LOSS counted) and recomputed, never decoded over.
TEST_F(ServingTest, DeepSeekV32ServesWhatTheRuntimeComputesWithItsIndexerKeysCached) {
  SCOPED_TRACE(rng_.Trace());
  const PresetModel m("v32-tiny", rng_.seed());
  const fs::path disk = fs::temp_directory_path() / ("kvtier_serving_v32_disk_" + std::to_string(rng_.seed()));
  fs::remove_all(disk);
  // Blocks of 25 KiB: the device tier holds 9, the host tier 1, so a
  // second prompt pushes the first one's blocks to disk.
  Cluster cluster(m.dir(), 1, 1,
                  {"--device-capacity", "256KiB", "--host-capacity", "32KiB", "--page-size", "4096", "--disk-dir",
                   disk.string(), "--disk-capacity", "64MiB"});
  ASSERT_TRUE(cluster.ok());
  const std::vector<uint32_t> prompt = RandomIds(2 * kBlock + 5, rng_.engine());
  ExpectGenerateAsRun(m.dir(), cluster.prefill_target, prompt, 12);
  absl::StatusOr<RemoteGeneration> hit = cluster.Generate(Request(prompt, 12));
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->usage.cached_tokens(), 2 * kBlock);
  ExpectSameGeneration(hit->tokens, GreedyAfter(*m.model, prompt, 2 * kBlock, 12), 1e-4);

  const std::vector<uint32_t> first = RandomIds(400, rng_.engine()), second = RandomIds(400, rng_.engine());
  ASSERT_TRUE(cluster.Generate(Request(first, 4)).ok());
  ASSERT_TRUE(cluster.Generate(Request(second, 4)).ok());
  const kvblock::LatentLayout layout = serving::ModelLayout(m.config, "any", kernels::Codec::kBf16, kBlock);
  const size_t record = kvblock::HeaderFor(layout, 0, layout.num_layers).RecordBytes();
  // One byte of one layer's indexer keys in each (the record ends the file).
  const size_t corrupted = CorruptDiskBlocks(disk, [&](uintmax_t size) {
    const uint32_t layer = static_cast<uint32_t>(rng_.engine()() % layout.num_layers);
    return static_cast<std::streamoff>(size - record + kvblock::kIndexedBlockHeaderBytes +
                                       layer * layout.LayerPayloadBytes() + layout.LatentPartBytes() +
                                       rng_.engine()() % layout.IndexerPartBytes());
  });
  ASSERT_GT(corrupted, 0u) << "no block reached the disk tier";
  absl::StatusOr<RemoteGeneration> got = cluster.Generate(Request(first, 4));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LT(got->usage.cached_tokens(), 384u);
  ExpectSameGeneration(got->tokens, GreedyAfter(*m.model, first, got->usage.cached_tokens(), 4), 1e-4);
  EXPECT_GT(cluster.CacheStats(0).checksum_failures(), 0u);
  fs::remove_all(disk);
}

// The same-host fast path changes how cached blocks travel, not what is
// computed: a turn that hits the cache generates exactly the same with it
// (the default: the shards are local) and with --no-fast-path, and only the
// first cluster's cache hands out shared-memory leases.
TEST_F(ServingTest, FastPathAndTcpGiveTheSameGenerations) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<uint32_t> prompt = RandomIds(3 * kBlock + 10, rng_.engine());
  std::vector<std::vector<runtime::Sampled>> second_turns;
  for (bool fast : {true, false}) {
    SCOPED_TRACE(fast ? "fast path" : "--no-fast-path");
    Cluster cluster(Tiny().dir, 1, 1, {}, "2000",
                    fast ? std::vector<std::string>{} : std::vector<std::string>{"--no-fast-path"});
    ASSERT_TRUE(cluster.ok());
    ASSERT_TRUE(cluster.Generate(Request(prompt, 8)).ok());  // stores the prompt's blocks
    absl::StatusOr<RemoteGeneration> hit = cluster.Generate(Request(prompt, 40));
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_EQ(hit->usage.cached_tokens(), 3 * kBlock);
    second_turns.push_back(hit->tokens);
    const v1::StatsResponse stats = cluster.CacheStats(0);
    if (fast) {
      EXPECT_GE(stats.fast_path_blocks_out(), 3u) << "prefill and decode read the cached prefix from shared memory";
      EXPECT_GT(stats.fast_path_bytes_in(), 0u) << "prefill wrote its blocks through a staging region";
    } else {
      EXPECT_EQ(stats.fast_path_blocks_out(), 0u);
      EXPECT_EQ(stats.fast_path_bytes_in(), 0u);
    }
  }
  ExpectSameGeneration(second_turns[0], second_turns[1], 0.0);
}

// Stop ids end a generation with STOP at their first occurrence, whether
// the prefill node samples it (token 0) or a decode worker does.
TEST_F(ServingTest, StopTokensEndTheGeneration) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  const std::vector<uint32_t> prompt = RandomIds(80, rng_.engine());
  const std::vector<runtime::Sampled> want = InProcess(prompt, 20);
  for (size_t at : {size_t{0}, size_t{6}}) {
    const uint32_t stop = want[at].token;
    size_t first = 0;
    while (want[first].token != stop) ++first;  // the stop id may come earlier
    // A namespace each, so that the second run does not hit the first's blocks.
    v1::GenerateRequest r = Request(prompt, 20, "stop-" + std::to_string(at));
    r.mutable_limits()->add_stop_token_ids(stop);
    absl::StatusOr<RemoteGeneration> got = cluster.Generate(r);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->reason, v1::FINISH_REASON_STOP);
    EXPECT_EQ(got->usage.generated_tokens(), first + 1);
    ExpectSameGeneration(got->tokens, std::vector<runtime::Sampled>(want.begin(), want.begin() + first + 1), 1e-4);
  }
}

// The two CLIs side by side: `kvtier generate --json` through the services
// prints what `kvtier run --json` prints in process.
TEST_F(ServingTest, KvtierGeneratePrintsWhatKvtierRunPrints) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  const std::string json = ExpectGenerateAsRun(Tiny().dir, cluster.prefill_target, RandomIds(130, rng_.engine()), 20);
  EXPECT_NE(json.find("\"cached_tokens\": 0}"), std::string::npos) << json;
}

// Text in and out on the trained model: Info names its byte tokenizer,
// `kvtier generate --prompt` prints (text, then ids) what `kvtier run
// --prompt` prints, a prompt scored token by token through
// --max-top-logprobs gets every token's logprob, and a model without a
// tokenizer refuses text.
TEST_F(ServingTest, TextInAndOutOnTheTrainedModel) {
  const std::string model = KVTIER_MODELS_DIR "/jargon-mla";
  Cluster cluster(model, 1, 1, {}, "2000", {}, {"--max-top-logprobs", "259"});
  ASSERT_TRUE(cluster.ok());
  absl::StatusOr<v1::ServerInfo> info = cli::PrefillInfo(cluster.prefill_target, absl::Seconds(10));
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->tokenizer(), "ByT5Tokenizer");
  const std::string common = " --prompt ':bogon: /boh-gon/, n.\n\n1. The' --max-new-tokens 30";
  for (const std::string json : {"", " --json"}) {
    const CommandResult run = RunCommand(std::string(KVTIER_BINARY) + " run --model " + model + common + json);
    const CommandResult generate =
        RunCommand(std::string(KVTIER_BINARY) + " generate --target " + cluster.prefill_target + common + json);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    ASSERT_EQ(generate.exit_code, 0) << generate.output;
    // generate's usage line goes to stderr, before.
    EXPECT_TRUE(generate.output.ends_with(run.output)) << generate.output << "\n---\n" << run.output;
    if (json.empty()) {
      // The text, then the ids that spell it.
      const std::string ids_line = run.output.substr(run.output.rfind('\n', run.output.size() - 2) + 1);
      std::string spelled;
      std::istringstream ids(ids_line);
      for (uint32_t id; ids >> id;) {
        if (id >= 3) spelled.push_back(static_cast<char>(id - 3));
      }
      EXPECT_EQ(run.output.substr(0, run.output.size() - ids_line.size()), spelled + "\n") << run.output;
    } else {
      EXPECT_NE(run.output.find("\"text\": \""), std::string::npos) << run.output;
    }
  }
  v1::GenerateRequest r = Request({4 + 3, 'a' + 3, 'b' + 3}, 1, "all-logprobs");
  r.mutable_limits()->set_top_logprobs(259);
  absl::StatusOr<RemoteGeneration> scored = cluster.Generate(r);
  ASSERT_TRUE(scored.ok()) << scored.status();
  ASSERT_EQ(scored->tokens.size(), 1u);
  EXPECT_EQ(scored->tokens[0].top.size(), 259u);
  r.mutable_limits()->set_top_logprobs(260);
  EXPECT_EQ(cluster.Generate(r).status().code(), absl::StatusCode::kInvalidArgument);

  Cluster tiny(Tiny().dir, 1, 1);
  ASSERT_TRUE(tiny.ok());
  const CommandResult no_tokenizer =
      RunCommand(std::string(KVTIER_BINARY) + " generate --target " + tiny.prefill_target + " --prompt hi");
  EXPECT_EQ(no_tokenizer.exit_code, 1) << no_tokenizer.output;
  EXPECT_NE(no_tokenizer.output.find("has no tokenizer"), std::string::npos) << no_tokenizer.output;
  const CommandResult both = RunCommand(std::string(KVTIER_BINARY) + " generate --target " + tiny.prefill_target +
                                        " --prompt hi --prompt-ids 1,2");
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_NE(both.output.find("exactly one of --prompt-ids and --prompt"), std::string::npos) << both.output;
}

// The README's first command on the trained model: readable text in two
// turns, the second's first block from the cache.
TEST_F(ServingTest, KvtierUpOnTheTrainedModelWritesText) {
  const fs::path dir = fs::temp_directory_path() / ("kvtier_up_trained_" + std::to_string(rng_.seed()));
  const CommandResult up = RunCommand(std::string(KVTIER_BINARY) + " up --max-new-tokens 40 --dir " + dir.string());
  fs::remove_all(dir);
  ASSERT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("(text through its byte tokenizer)"), std::string::npos) << up.output;
  EXPECT_NE(up.output.find(":cache: /kash/, n."), std::string::npos) << up.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(up.output, m, std::regex(R"(turn 2: (\d+) prompt tokens, (\d+) from the cache)")))
      << up.output;
  EXPECT_GE(std::stoi(m[2]), 64) << up.output;
  EXPECT_NE(up.output.find("all three stopped cleanly"), std::string::npos) << up.output;
}

// The README's first command on the tiny preset: a two-turn conversation
// whose second turn hits, the cache's stats, a clean stop.
// In plaintext and, with --tls, over TLS from a throwaway CA (mutual TLS
// to the cache and the decode worker) that is gone afterwards; with
// --tls-keep, from a CA kept for later calls.
TEST_F(ServingTest, KvtierUpRunsAConversationAndStopsCleanly) {
  const fs::path kept = fs::temp_directory_path() / ("kvtier_up_kept_" + std::to_string(rng_.seed()));
  for (const std::string& tls : {std::string(), std::string(" --tls"), " --tls-keep " + kept.string()}) {
    SCOPED_TRACE(tls);
    const fs::path dir = fs::temp_directory_path() / ("kvtier_up_" + std::to_string(rng_.seed()));
    const CommandResult up =
        RunCommand(std::string(KVTIER_BINARY) + " up --preset tiny --prompt-tokens 150 --max-new-tokens 24 --dir " +
                   dir.string() + tls);
    size_t left = 0;  // what --tls left under --dir besides the model
    for (const auto& entry : fs::directory_iterator(dir))
      left += entry.path().filename().string().rfind("tls-", 0) == 0;
    fs::remove_all(dir);
    if (tls.starts_with(" --tls-keep")) {
      // The CA and the certificate the servers used, kept: it verifies.
      EXPECT_TRUE(fs::exists(kept / "ca.key")) << up.output;
      const CommandResult verify =
          RunCommand("openssl verify -CAfile " + (kept / "ca.crt").string() + " " + (kept / "server/tls.crt").string());
      EXPECT_EQ(verify.exit_code, 0) << verify.output;
      EXPECT_NE(up.output.find("--tls-dir"), std::string::npos) << "says how to call the servers: " << up.output;
      fs::remove_all(kept);
    }
    ASSERT_EQ(up.exit_code, 0) << up.output;
    EXPECT_NE(up.output.find("turn 1: 150 prompt tokens, 0 from the cache"), std::string::npos) << up.output;
    EXPECT_NE(up.output.find("turn 2: 190 prompt tokens, 128 from the cache"), std::string::npos) << up.output;
    // Turn 1's two prompt blocks, then turn 2's third.
    EXPECT_NE(up.output.find("blocks stored 3, deduplicated 0"), std::string::npos) << up.output;
    EXPECT_NE(up.output.find("all three stopped cleanly"), std::string::npos) << up.output;
    EXPECT_EQ(up.output.find("every call over TLS") != std::string::npos, !tls.empty()) << up.output;
    EXPECT_EQ(left, 0u) << "the throwaway certificates stayed behind";
  }
}

// A second request sharing a 192-token prefix reuses it; a conversation's
// second turn (prompt + answer + question) reuses the blocks decode wrote
// back; outputs stay those of the in-process runtime.
TEST_F(ServingTest, SharedPrefixesAndNextTurnsHitTheCache) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  const std::vector<uint32_t> prefix = RandomIds(192, rng_.engine());
  std::vector<uint32_t> a = prefix, b = prefix;
  for (uint32_t t : RandomIds(20, rng_.engine())) a.push_back(t);
  for (uint32_t t : RandomIds(30, rng_.engine())) b.push_back(t);
  ASSERT_TRUE(cluster.Generate(Request(a, 8)).ok());
  // The prefill node marks a prompt of which nothing was cached a cold
  // start (its 3 blocks), and not one that continues a cached prefix.
  EXPECT_EQ(cluster.CacheStats(0).blocks_stored_cold_start(), 3u);
  absl::StatusOr<RemoteGeneration> second = cluster.Generate(Request(b, 8));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->usage.cached_tokens(), 192u);
  // The reference attends over the stored prefix as the services do. (One
  // pass over the whole prompt differs by the prefix's bf16 rounding, which
  // can flip a near tie of this random model: not a check to make exactly.)
  ExpectSameGeneration(second->tokens, InProcess(b, 8, 192), 1e-4);

  // Turn 1: 100 prompt + 100 generated tokens fill 3 blocks (192 tokens);
  // turn 2 sends all of it plus a question.
  std::vector<uint32_t> conversation = RandomIds(100, rng_.engine());
  absl::StatusOr<RemoteGeneration> turn1 = cluster.Generate(Request(conversation, 100, "chat"));
  ASSERT_TRUE(turn1.ok()) << turn1.status();
  EXPECT_EQ(cluster.CacheStats(0).blocks_stored_cold_start(), 4u) << "turn 1's prompt block, not decode's";
  // In process: turn 1's prompt and its decode steps, whose first 3 blocks
  // are what decode wrote back.
  const runtime::Model& model = *Tiny().model;
  runtime::SequenceCache turn1_cache = model.NewCache(kernels::Codec::kBf16, kBlock);
  std::vector<float> logits(256);
  ASSERT_TRUE(model.Prefill(conversation, turn1_cache, logits).ok());
  for (size_t i = 0; i + 1 < turn1->tokens.size(); ++i) {
    ASSERT_TRUE(model.Step(turn1->tokens[i].token, turn1_cache, logits).ok());
  }
  for (auto& layer : turn1_cache.blocks) layer.erase(layer.begin() + 3, layer.end());
  for (auto& tail : turn1_cache.tail) tail.clear();
  turn1_cache.length = 192;
  for (const auto& s : turn1->tokens) conversation.push_back(s.token);
  for (uint32_t t : RandomIds(10, rng_.engine())) conversation.push_back(t);
  absl::StatusOr<RemoteGeneration> turn2 = cluster.Generate(Request(conversation, 8, "chat"));
  ASSERT_TRUE(turn2.ok()) << turn2.status();
  EXPECT_EQ(turn2->usage.cached_tokens(), 192u) << "blocks 1 and 2 come from decode's write-back";
  EXPECT_EQ(cluster.CacheStats(0).blocks_stored_cold_start(), 4u) << "turn 2 continued a cached prefix";
  ExpectSameGeneration(turn2->tokens, Continue(turn1_cache, conversation, 8), 1e-4);
  // Namespaces are part of the key: another tenant's identical turn misses.
  absl::StatusOr<RemoteGeneration> other = cluster.Generate(Request(conversation, 8, "other"));
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(other->usage.cached_tokens(), 0u);
  EXPECT_EQ(cluster.CacheStats(0).blocks_stored_cold_start(), 7u) << "the other tenant's 3 blocks";
  // Under a quarter of a prompt's blocks found is a cold start too (1 of
  // 5: its 4 new blocks), a quarter or more is not (2 of 5).
  for (const size_t shared : {1, 2}) {
    std::vector<uint32_t> prompt(prefix.begin(), prefix.begin() + shared * kBlock);
    for (uint32_t t : RandomIds(5 * kBlock - prompt.size(), rng_.engine())) prompt.push_back(t);
    absl::StatusOr<RemoteGeneration> partly = cluster.Generate(Request(prompt, 2));
    ASSERT_TRUE(partly.ok()) << partly.status();
    EXPECT_EQ(partly->usage.cached_tokens(), shared * kBlock);
    EXPECT_EQ(cluster.CacheStats(0).blocks_stored_cold_start(), 11u) << shared << " of 5 blocks found";
  }
}

// Every server ending its connections each second (a GOAWAY at the
// connection's age): the prefill node's, decode worker's and cache's
// channels to each other reconnect under generations that go on, none
// failing, each what the runtime computes, every turn after the first
// finding the shared prefix in the cache.
TEST_F(ServingTest, GenerationsGoOnAcrossConnectionAges) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<std::string> age = {"--max-connection-age-seconds", "1"};
  Cluster cluster(Tiny().dir, 1, 1, age, "2000", age);
  ASSERT_TRUE(cluster.ok());
  const std::vector<uint32_t> prefix = RandomIds(3 * kBlock, rng_.engine());
  int generations = 0;
  for (const absl::Time end = absl::Now() + absl::Seconds(4); absl::Now() < end; ++generations) {
    std::vector<uint32_t> prompt = prefix;
    for (uint32_t t : RandomIds(10 + generations, rng_.engine())) prompt.push_back(t);
    absl::StatusOr<RemoteGeneration> got = cluster.Generate(Request(prompt, 16));
    ASSERT_TRUE(got.ok()) << "generation " << generations << ": " << got.status();
    EXPECT_EQ(got->usage.cached_tokens(), generations == 0 ? 0u : prefix.size()) << generations;
    ExpectSameGeneration(got->tokens, InProcess(prompt, 16, got->usage.cached_tokens()), 1e-4);
  }
  EXPECT_GE(generations, 4);
}

// The cache deadline bounds each call to a shard, not the prefill that
// feeds a Put stream: a prefill longer than the deadline still stores.
TEST_F(ServingTest, APrefillLongerThanTheCacheDeadlineStillStoresItsBlocks) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 1, 1, {}, /*deadline_ms=*/"20");
  ASSERT_TRUE(cluster.ok());
  const std::vector<uint32_t> prompt = RandomIds(2000, rng_.engine());
  absl::StatusOr<RemoteGeneration> first = cluster.Generate(Request(prompt, 2));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_GT(first->usage.time_to_first_token_us(), 20000u) << "the prefill must outlast the deadline";
  // Asked of the cache itself: a second Generate would also read the
  // prefix under the 20 ms deadline, which a loaded machine can miss.
  EXPECT_EQ(cluster.CacheStats(0).blocks_stored(), 2000u / kBlock);
}

// 16 clients at once, half of them sharing prefixes: continuous batching
// across them gives each the in-process result.
TEST_F(ServingTest, SixteenConcurrentGenerations) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 2, 1);
  ASSERT_TRUE(cluster.ok());
  std::vector<std::vector<uint32_t>> prompts;
  const std::vector<uint32_t> shared = RandomIds(128, rng_.engine());
  for (int i = 0; i < 16; ++i) {
    std::vector<uint32_t> p = i % 2 ? shared : std::vector<uint32_t>{};
    for (uint32_t t : RandomIds(20 + 7 * i, rng_.engine())) p.push_back(t);
    prompts.push_back(p);
  }
  std::vector<std::future<absl::StatusOr<RemoteGeneration>>> runs;
  for (const auto& p : prompts) {
    runs.push_back(std::async(std::launch::async, [&cluster, p] { return cluster.Generate(Request(p, 40)); }));
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE("client " + std::to_string(i));
    absl::StatusOr<RemoteGeneration> got = runs[i].get();
    ASSERT_TRUE(got.ok()) << got.status();
    // The odd clients' shared blocks may be another odd client's: the first
    // prefill to store them wins, and a pass over another prompt can round
    // their bf16 values a step apart (MixedInProcess), moving logprobs by
    // up to about 1e-3; the others are exactly this client's own.
    ExpectSameGeneration(got->tokens, InProcess(prompts[i], 40, got->usage.cached_tokens()), i % 2 ? 3e-3 : 1e-4);
  }
  // The worker counts each generation OK, none cancelled by the prefill
  // node's call ending first (it counts a call as it sends the status,
  // a moment after the finish it relayed).
  const std::string ok = "kvtier_decode_requests_total{code=\"OK\"}";
  EXPECT_TRUE(testing::Eventually([&] { return Scrape(cluster.decode_metrics[0], ok) >= 16.0; }));
  EXPECT_EQ(Scrape(cluster.decode_metrics[0], ok), 16.0);
  EXPECT_EQ(Scrape(cluster.decode_metrics[0], "kvtier_decode_requests_total{code=\"CANCELLED\"}"), -1.0);
}

// Sampled generations (temperature, top-p, each its own seed), eight at
// once so that the decode worker draws each step's tokens together: every
// token as the in-process runtime draws it from the same seed.
TEST_F(ServingTest, SampledGenerationsFollowTheirSeedsInBatches) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  std::vector<std::vector<uint32_t>> prompts;
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    prompts.push_back(RandomIds(30 + 11 * i, rng_.engine()));
    requests.push_back(Request(prompts.back(), 30));
    requests.back().mutable_sampling()->set_temperature(0.9f);
    requests.back().mutable_sampling()->set_top_p(i % 2 ? 0.8f : 1.0f);
    requests.back().mutable_sampling()->set_seed(1000 + rng_.engine()() % 1000);
  }
  std::vector<std::future<absl::StatusOr<RemoteGeneration>>> runs;
  for (const auto& r : requests) {
    runs.push_back(std::async(std::launch::async, [&cluster, r] { return cluster.Generate(r); }));
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    SCOPED_TRACE("client " + std::to_string(i));
    absl::StatusOr<RemoteGeneration> got = runs[i].get();
    ASSERT_TRUE(got.ok()) << got.status();
    const runtime::Sampling sampling = serving::ToSampling(requests[i].sampling());
    ExpectSameGeneration(got->tokens, InProcess(prompts[i], 30, got->usage.cached_tokens(), sampling), 1e-4);
  }
}

// SIGKILL one of two cache shards between generations: every later request
// still completes with the same output (its blocks recomputed and sent
// inline), and repeats of earlier prompts still hit on the live shard.
TEST_F(ServingTest, AShardKilledMidRunLosesNoRequest) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 2, 1);
  ASSERT_TRUE(cluster.ok());
  // Which shard each block lives on, as the services choose it.
  auto shards = cache::ShardSet::Create(cluster.cache_targets[0] + "," + cluster.cache_targets[1], absl::Seconds(1));
  ASSERT_TRUE(shards.ok());
  const kvblock::LatentLayout layout =
      serving::ModelLayout(Tiny().model->config(), *serving::ModelId(Tiny().dir, runtime::ModelType::kDeepseekV2),
                           kernels::Codec::kBf16, kBlock);
  std::vector<std::vector<uint32_t>> prompts;
  for (int i = 0; i < 6; ++i) prompts.push_back(RandomIds(200 + 10 * i, rng_.engine()));
  for (int round = 0; round < 2; ++round) {
    for (size_t i = 0; i < prompts.size(); ++i) {
      if (round == 0 && i == 3) cluster.caches[1]->Stop(SIGKILL);
      SCOPED_TRACE("round " + std::to_string(round) + " prompt " + std::to_string(i));
      absl::StatusOr<RemoteGeneration> got = cluster.Generate(Request(prompts[i], 12));
      ASSERT_TRUE(got.ok()) << got.status();
      if (round == 0) {  // every block computed in one pass, stored or sent inline
        ExpectSameGeneration(got->tokens, InProcess(prompts[i], 12), 1e-4);
        continue;
      }
      // Round 1: the cached prefix ends at the first block on the dead
      // shard; the prefill node computes the rest after it, but the live
      // shard keeps round 0's copies of its blocks (a second Put of a key is
      // a no-op), and those are what decode reads.
      const size_t cached = got->usage.cached_tokens();
      const auto chain = kvblock::ComputeBlockChain("default", kvblock::LayoutId(layout), kBlock, prompts[i]);
      std::vector<bool> round0_copy(chain.size());
      for (size_t b = 0; b < chain.size(); ++b)
        round0_copy[b] = b < cached / kBlock || (*shards)->ShardOf(chain[b]) == cluster.cache_targets[0];
      ExpectSameGeneration(got->tokens, MixedInProcess(prompts[i], 12, cached, round0_copy), 1e-4);
    }
  }
}

// Blocks demoted to the disk tier and corrupted there: the cache reports
// DATA_LOSS (counted), the prefill node recomputes, the output is right.
TEST_F(ServingTest, ACorruptedBlockIsDetectedAndRecomputed) {
  SCOPED_TRACE(rng_.Trace());
  const fs::path disk = fs::temp_directory_path() / ("kvtier_serving_disk_" + std::to_string(rng_.seed()));
  fs::remove_all(disk);
  // The device tier holds 8 of these 15 KiB blocks (a prompt's pending
  // blocks must fit there while its layers stream in), the host tier 1:
  // a second prompt pushes the first one's blocks to disk.
  Cluster cluster(Tiny().dir, 1, 1,
                  {"--device-capacity", "128KiB", "--host-capacity", "16KiB", "--page-size", "4096", "--disk-dir",
                   disk.string(), "--disk-capacity", "64MiB"});
  ASSERT_TRUE(cluster.ok());
  const std::vector<uint32_t> first = RandomIds(400, rng_.engine()), second = RandomIds(400, rng_.engine());
  ASSERT_TRUE(cluster.Generate(Request(first, 4)).ok());
  ASSERT_TRUE(cluster.Generate(Request(second, 4)).ok());
  const size_t corrupted =
      CorruptDiskBlocks(disk, [](uintmax_t size) { return static_cast<std::streamoff>(size / 2); });
  ASSERT_GT(corrupted, 0u) << "no block reached the disk tier";
  absl::StatusOr<RemoteGeneration> got = cluster.Generate(Request(first, 4));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_LT(got->usage.cached_tokens(), 384u);
  ExpectSameGeneration(got->tokens, InProcess(first, 4, got->usage.cached_tokens()), 1e-4);
  EXPECT_GT(cluster.CacheStats(0).checksum_failures(), 0u);
  fs::remove_all(disk);
}

// A decode worker SIGKILLed mid-stream: alone, the client gets UNAVAILABLE
// saying so; with a second worker, the request finishes there, unchanged.
TEST_F(ServingTest, ADecodeWorkerDyingMidStream) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<uint32_t> prompt = RandomIds(90, rng_.engine());
  const std::vector<runtime::Sampled> want = InProcess(prompt, 400);
  for (int workers : {1, 2}) {
    SCOPED_TRACE(std::to_string(workers) + " decode workers");
    Cluster cluster(Tiny().dir, 1, workers);
    ASSERT_TRUE(cluster.ok());
    auto stub = v1::Prefill::NewStub(MakeChannel(cluster.prefill_target));
    grpc::ClientContext context;
    auto reader = stub->Generate(&context, Request(prompt, 400));
    std::vector<uint32_t> ids;
    v1::GenerateResponse event;
    while (reader->Read(&event)) {
      if (!event.has_token()) continue;
      ids.push_back(event.token().token_id());
      if (ids.size() == 5) cluster.decoders[0]->Stop(SIGKILL);  // the first request goes to worker 0
    }
    const grpc::Status status = reader->Finish();
    if (workers == 1) {
      EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
      EXPECT_NE(status.error_message().find("no decode worker could continue"), std::string::npos)
          << status.error_message();
    } else {
      ASSERT_TRUE(status.ok()) << status.error_message();
      ASSERT_EQ(ids.size(), want.size());
      for (size_t i = 0; i < ids.size(); ++i) ASSERT_EQ(ids[i], want[i].token) << "token " << i;
    }
  }
}

// A client cancelling mid-generation leaves nothing behind: the decode
// worker's open sequences return to 0.
TEST_F(ServingTest, CancellationFreesTheDecodeSequence) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  auto stub = v1::Prefill::NewStub(MakeChannel(cluster.prefill_target));
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, Request(RandomIds(50, rng_.engine()), 1500));
  v1::GenerateResponse event;
  for (int i = 0; i < 4 && reader->Read(&event); ++i) {
  }
  auto sequences = [&] { return Scrape(cluster.decode_metrics[0], "kvtier_decode_sequences"); };
  EXPECT_EQ(sequences(), 1.0);
  context.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The worker's stream hears of it at once (OnCancel); allow generous time.
  EXPECT_TRUE(testing::Eventually([&] { return sequences() == 0.0; }, std::chrono::seconds(20)));
}

// One tenant, or one client address, cannot hold every generation the
// prefill node (and behind it the decode worker) has room for: past its
// bound a Generate is RESOURCE_EXHAUSTED at once, naming the flag, while
// others are served; a generation that ends gives its place back.
TEST_F(ServingTest, OneTenantOrClientCannotHoldEveryGeneration) {
  SCOPED_TRACE(rng_.Trace());
  const testing::TempDir dir("kvtier_serving_bounds_");
  const testing::TestTenant service{"kvtier", "SERVICE", "acme,globex", "service-token-51aa"};
  const testing::TestTenant acme{"acme", "WRITER", "acme", "acme-token-62bb"};
  const testing::TestTenant globex{"globex", "WRITER", "globex", "globex-token-73cc"};
  const std::string tenants = (dir / "tenants.json").string();
  std::ofstream(tenants) << testing::TenantsJson({service, acme, globex});
  Cluster cluster(Tiny().dir, 1, 1, {"--tenants", tenants}, "2000",
                  {"--tenants", tenants, "--token-file", testing::WriteTokenFile(dir.path(), service.token)},
                  {"--max-generations-per-tenant", "2", "--max-generations-per-client", "3"});
  ASSERT_TRUE(cluster.ok());
  // A small receive window: a generation the client stops reading stalls
  // (and stays under way) instead of streaming to its end into buffers.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto stub =
      v1::Prefill::NewStub(grpc::CreateCustomChannel(cluster.prefill_target, grpc::InsecureChannelCredentials(), args));
  const auto as = [](grpc::ClientContext& context, const testing::TestTenant& t) {
    context.AddMetadata("authorization", "Bearer " + t.token);
  };
  struct Held {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  };
  // A long generation with every alternative, read until it streams: held
  // open.
  const auto open = [&](const testing::TestTenant& t) {
    auto held = std::make_unique<Held>();
    as(held->context, t);
    v1::GenerateRequest request = Request(RandomIds(20, rng_.engine()), 1500, t.ns);
    request.mutable_limits()->set_top_logprobs(serving::kMaxTopLogprobs);
    held->reader = stub->Generate(&held->context, request);
    v1::GenerateResponse event;
    EXPECT_TRUE(held->reader->Read(&event)) << t.ns;
    return held;
  };
  const auto refused = [&](const testing::TestTenant& t) {
    grpc::ClientContext context;
    as(context, t);
    auto reader = stub->Generate(&context, Request(RandomIds(20, rng_.engine()), 2, t.ns));
    v1::GenerateResponse event;
    while (reader->Read(&event)) {
    }
    return reader->Finish();
  };
  auto a1 = open(acme), a2 = open(acme);
  const grpc::Status third = refused(acme);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << third.error_message();
  EXPECT_NE(third.error_message().find("--max-generations-per-tenant"), std::string::npos) << third.error_message();
  auto g1 = open(globex);  // another tenant is served
  const grpc::Status fourth = refused(globex);
  EXPECT_EQ(fourth.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << fourth.error_message();
  EXPECT_NE(fourth.error_message().find("--max-generations-per-client"), std::string::npos) << fourth.error_message();
  a1->context.TryCancel();
  EXPECT_EQ(a1->reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(testing::Eventually([&] { return refused(globex).ok(); }, std::chrono::seconds(20)))
      << "the cancelled generation's place did not come back";
  for (Held* h : {a2.get(), g1.get()}) h->context.TryCancel();
  for (Held* h : {a2.get(), g1.get()}) h->reader->Finish().IgnoreError();
}

// The threads of a process, from /proc.
int ThreadsOf(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// A generation holds no thread while its tokens stream (gRPC's callback
// API: the decode worker's batcher wakes its stream, the prefill node relays
// each token as it comes): many generations at once leave both servers'
// thread counts where they were, where one handler thread each would add as
// many threads as streams.
TEST_F(ServingTest, GenerationsHoldNoThreadEach) {
  SCOPED_TRACE(rng_.Trace());
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  const pid_t decode = cluster.decoders[0]->pid(), prefill = cluster.prefill->pid();
  // Warmed up: one generation has run, so its pools have their threads.
  ASSERT_TRUE(cluster.Generate(Request(RandomIds(20, rng_.engine()), 4)).ok());
  const int decode_before = ThreadsOf(decode), prefill_before = ThreadsOf(prefill);
  ASSERT_GT(decode_before, 0);
  ASSERT_GT(prefill_before, 0);
  constexpr int kStreams = 48;
  auto stub = v1::Prefill::NewStub(MakeChannel(cluster.prefill_target));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>>> readers;
  for (int i = 0; i < kStreams; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    readers.push_back(stub->Generate(contexts.back().get(), Request(RandomIds(30, rng_.engine()), 1500)));
  }
  // Every stream has reached the worker once its second token arrives.
  for (auto& reader : readers) {
    v1::GenerateResponse event;
    for (int i = 0; i < 2; ++i) ASSERT_TRUE(reader->Read(&event));
  }
  const double open = Scrape(cluster.decode_metrics[0], "kvtier_decode_sequences");
  const int decode_during = ThreadsOf(decode), prefill_during = ThreadsOf(prefill);
  EXPECT_GE(open, kStreams / 2) << "the generations ended before the count";
  EXPECT_LT(decode_during, decode_before + kStreams / 4) << open << " streams open";
  EXPECT_LT(prefill_during, prefill_before + kStreams / 4) << open << " streams open";
  for (auto& context : contexts) context->TryCancel();
  for (auto& reader : readers) reader->Finish();
}

// Fetched records go back to the model servers' pools once their sequences
// let go, up to --record-pool: the decode worker keeps every block it
// fetched (the prompt's, from the cache), the prefill node the prefix its
// second request found cached; with --record-pool 0 neither keeps any.
TEST_F(ServingTest, RecordPoolKeepsFetchedBlocksUpToItsFlag) {
  SCOPED_TRACE(rng_.Trace());
  const kvblock::LatentLayout layout =
      serving::ModelLayout(Tiny().model->config(), *serving::ModelId(Tiny().dir, runtime::ModelType::kDeepseekV2),
                           kernels::Codec::kBf16, kBlock);
  const double record_bytes = static_cast<double>(kvblock::HeaderFor(layout, 0, layout.num_layers).RecordBytes());
  const std::vector<uint32_t> prompt = RandomIds(3 * kBlock + 10, rng_.engine());
  for (const bool keep : {true, false}) {
    SCOPED_TRACE(keep ? "default pool" : "--record-pool 0");
    Cluster cluster(Tiny().dir, 1, 1, {}, "2000",
                    keep ? std::vector<std::string>{} : std::vector<std::string>{"--record-pool", "0"});
    ASSERT_TRUE(cluster.ok());
    for (int turn = 0; turn < 2; ++turn) ASSERT_TRUE(cluster.Generate(Request(prompt, 3)).ok());
    // Both turns' decode sequences fetched the prompt's 3 blocks; the second
    // prefill found them cached. Wait for the last sequence to let go.
    const std::string decode = cluster.decode_metrics[0], prefill = cluster.prefill_metrics;
    EXPECT_TRUE(testing::Eventually(
        [&] {
          return Scrape(decode, "kvtier_decode_record_pool_bytes{state=\"held\"}") == 0.0 &&
                 Scrape(prefill, "kvtier_prefill_record_pool_bytes{state=\"held\"}") == 0.0;
        },
        std::chrono::seconds(20)));
    EXPECT_EQ(Scrape(decode, "kvtier_decode_blocks_fetched_total"), 6.0);
    EXPECT_EQ(Scrape(decode, "kvtier_decode_record_pool_bytes{state=\"held\"}"), 0.0);
    EXPECT_EQ(Scrape(prefill, "kvtier_prefill_record_pool_bytes{state=\"held\"}"), 0.0);
    // Turn 2 reused turn 1's strings: 3 records idle, not 6.
    EXPECT_EQ(Scrape(decode, "kvtier_decode_record_pool_bytes{state=\"idle\"}"), keep ? 3 * record_bytes : 0.0);
    EXPECT_EQ(Scrape(prefill, "kvtier_prefill_record_pool_bytes{state=\"idle\"}"), keep ? 3 * record_bytes : 0.0);
  }
}

// With a tenants file on every server: an end client reaches its tenant's
// namespace through the prefill node and no other; the prefill node and
// decode worker reach the cache as a service; a decode worker refuses an
// end client and an admin.
TEST_F(ServingTest, TenantsReachOnlyTheirNamespacesThroughThePrefillNode) {
  const testing::TempDir dir("kvtier_serving_tenants_");
  const testing::TestTenant service{"kvtier", "SERVICE", "acme", "service-token-1e9b"};
  const testing::TestTenant acme{"acme", "WRITER", "acme", "acme-token-5c2d"};
  const testing::TestTenant ops{"ops", "ADMIN", "", "ops-token-a71c"};
  const std::string tenants = (dir / "tenants.json").string();
  std::ofstream(tenants) << testing::TenantsJson({service, acme, ops});
  const std::string service_token = testing::WriteTokenFile(dir.path(), service.token);
  const std::string acme_token = testing::WriteTokenFile(dir.path(), acme.token);
  const std::string ops_token = testing::WriteTokenFile(dir.path(), ops.token);
  // Without the fast path: the worker reads the cached prefix over gRPC.
  Cluster cluster(Tiny().dir, 1, 1, {"--tenants", tenants}, "2000",
                  {"--tenants", tenants, "--token-file", service_token, "--no-fast-path"});
  ASSERT_TRUE(cluster.ok());
  const std::vector<uint32_t> prompt = RandomIds(2 * kBlock + 3, rng_.engine());

  // No token: refused at the door.
  EXPECT_EQ(cluster.Generate(Request(prompt, 4)).status().code(), absl::StatusCode::kUnauthenticated);
  ASSERT_TRUE(SetClientIdentity({.tls = {}, .token_file = acme_token}).ok());
  absl::StatusOr<RemoteGeneration> mine = cluster.Generate(Request(prompt, 4));  // acme's namespace by default
  EXPECT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ(cluster.Generate(Request(prompt, 4, "globex")).status().code(), absl::StatusCode::kPermissionDenied);
  // The prefill node stored acme's blocks for acme: a second turn hits.
  absl::StatusOr<RemoteGeneration> again = cluster.Generate(Request(prompt, 4, "acme"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->usage.cached_tokens(), 2 * kBlock);
  // Both read as acme: the prefill node's Match and the worker's Get.
  EXPECT_GE(Scrape(cluster.cache_metrics[0], R"(kvtier_cache_tenant_hits_total{tenant="acme"})"), 4);
  ExpectNothingIsTheServices(ScrapeMetrics(cluster.cache_metrics[0]));
  // A decode worker serves services, not end clients or admins.
  for (const std::string& token : {acme_token, ops_token}) {
    auto channel = MakeChannelAs({.tls = {}, .token_file = token}, cluster.decode_targets[0]);
    ASSERT_TRUE(channel.ok());
    grpc::ClientContext context;
    v1::DecodeRequest direct;
    direct.set_kv_namespace("acme");
    auto reader = v1::Decode::NewStub(*channel)->Decode(&context, direct);
    v1::DecodeResponse event;
    while (reader->Read(&event)) {
    }
    const grpc::Status refused = reader->Finish();
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED) << token << ": " << refused.error_message();
  }
  ASSERT_TRUE(SetClientIdentity({}).ok());
}

// A stub of the Prefill service at `target` calling with `token` (its
// file written in `dir`).
std::unique_ptr<v1::Prefill::Stub> PrefillAs(const std::string& target, const std::filesystem::path& dir,
                                             const std::string& token) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel =
      MakeChannelAs({.tls = {}, .token_file = testing::WriteTokenFile(dir, token)}, target);
  EXPECT_TRUE(channel.ok()) << channel.status();
  return v1::Prefill::NewStub(*channel);
}

grpc::StatusCode InfoCode(v1::Prefill::Stub& stub) {
  grpc::ClientContext context;
  v1::ServerInfo info;
  return stub.Info(&context, v1::InfoRequest(), &info).error_code();
}

// A long generation of `prompt` through `stub`, its decode worker paused
// after four tokens while the tenants file `tenants` becomes `contents`
// and until `refused` says the prefill node has taken it, then resumed.
// It must end before its end, and the worker's sequence go; how it ended.
grpc::Status GenerateAcrossAReload(Cluster& cluster, v1::Prefill::Stub& stub, const std::vector<uint32_t>& prompt,
                                   const std::string& tenants, const std::string& contents,
                                   const std::function<bool()>& refused) {
  constexpr uint32_t kMaxNew = 1500;
  grpc::ClientContext context;
  auto reader = stub.Generate(&context, Request(prompt, kMaxNew));
  v1::GenerateResponse event;
  uint32_t tokens = 0;
  for (; tokens < 4 && reader->Read(&event); ++tokens) EXPECT_TRUE(event.has_token());
  EXPECT_EQ(tokens, 4u);
  EXPECT_EQ(kill(cluster.decoders[0]->pid(), SIGSTOP), 0);
  testing::WriteAtomically(tenants, contents);
  EXPECT_TRUE(testing::Eventually(refused, std::chrono::seconds(20))) << "the prefill node did not take the new file";
  EXPECT_EQ(kill(cluster.decoders[0]->pid(), SIGCONT), 0);
  while (reader->Read(&event)) {
    EXPECT_FALSE(event.has_finished()) << "the generation ran to its end";
    ++tokens;
  }
  EXPECT_LT(tokens, kMaxNew);
  EXPECT_TRUE(testing::Eventually([&] { return Scrape(cluster.decode_metrics[0], "kvtier_decode_sequences") == 0.0; },
                                  std::chrono::seconds(20)))
      << "the decode worker's sequence outlived the generation";
  return reader->Finish();
}

// A generation outlives the check its Generate call got as it began: once
// the tenants file a reload takes no longer knows its tenant, the prefill
// node relays no more tokens (UNAUTHENTICATED) and lets the decode
// worker's sequence go. The decode worker, paused meanwhile, reads no
// tenants file: the prefill node alone ends it.
TEST_F(ServingTest, AGenerationEndsWhenTheTenantsFileNoLongerKnowsItsTenant) {
  SCOPED_TRACE(rng_.Trace());
  const testing::TempDir dir("kvtier_serving_removed_");
  const testing::TestTenant service{"kvtier", "SERVICE", "acme,globex", "service-token-77c1"};
  const testing::TestTenant acme{"acme", "WRITER", "acme", "acme-token-0d4e"};
  const testing::TestTenant globex{"globex", "WRITER", "globex", "globex-token-3b8a"};
  const std::string tenants = (dir / "tenants.json").string();
  testing::WriteAtomically(tenants, testing::TenantsJson({service, acme, globex}));
  const std::string service_token = testing::WriteTokenFile(dir.path(), service.token);
  Cluster cluster(Tiny().dir, 1, 1, {"--tenants", tenants}, "2000", {"--token-file", service_token, "--no-fast-path"},
                  {"--tenants", tenants, "--reload-seconds", "1"});
  ASSERT_TRUE(cluster.ok());
  const auto acme_stub = PrefillAs(cluster.prefill_target, dir.path(), acme.token);
  const auto globex_stub = PrefillAs(cluster.prefill_target, dir.path(), globex.token);
  const grpc::Status ended = GenerateAcrossAReload(
      cluster, *acme_stub, RandomIds(50, rng_.engine()), tenants, testing::TenantsJson({service, globex}),
      [&] { return InfoCode(*acme_stub) == grpc::StatusCode::UNAUTHENTICATED; });
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAUTHENTICATED) << ended.error_message();
  // Another tenant's generation is served whole.
  grpc::ClientContext globex_context;
  auto globex_reader = globex_stub->Generate(&globex_context, Request(RandomIds(50, rng_.engine()), 8));
  uint32_t globex_tokens = 0;
  for (v1::GenerateResponse event; globex_reader->Read(&event);) globex_tokens += event.has_token() ? 1 : 0;
  EXPECT_TRUE(globex_reader->Finish().ok());
  EXPECT_EQ(globex_tokens, 8u);
  EXPECT_EQ(InfoCode(*globex_stub), grpc::StatusCode::OK);
}

// The same on a decode worker: once the tenants file a reload takes no
// longer knows the prefill node's token, its sequence gets no more tokens,
// and the prefill node ends the generation saying why. The worker, paused
// until the prefill node (which reads the same file, but whose caller is
// still known) has taken the file, takes it as it resumes.
TEST_F(ServingTest, ADecodeSequenceEndsWhenTheTenantsFileNoLongerKnowsItsPrefillNode) {
  SCOPED_TRACE(rng_.Trace());
  const testing::TempDir dir("kvtier_serving_removed_service_");
  const testing::TestTenant service{"kvtier", "SERVICE", "acme", "service-token-a3f0"};
  const testing::TestTenant acme{"acme", "WRITER", "acme", "acme-token-92bd"};
  const std::string tenants = (dir / "tenants.json").string();
  testing::WriteAtomically(tenants, testing::TenantsJson({service, acme}));
  const std::string service_token = testing::WriteTokenFile(dir.path(), service.token);
  Cluster cluster(Tiny().dir, 1, 1, {}, "2000",
                  {"--tenants", tenants, "--token-file", service_token, "--reload-seconds", "1", "--no-fast-path"});
  ASSERT_TRUE(cluster.ok());
  const auto acme_stub = PrefillAs(cluster.prefill_target, dir.path(), acme.token);
  const auto service_stub = PrefillAs(cluster.prefill_target, dir.path(), service.token);
  const grpc::Status ended =
      GenerateAcrossAReload(cluster, *acme_stub, RandomIds(50, rng_.engine()), tenants, testing::TenantsJson({acme}),
                            [&] { return InfoCode(*service_stub) == grpc::StatusCode::UNAUTHENTICATED; });
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::UNAUTHENTICATED) << ended.error_message();
  EXPECT_NE(ended.error_message().find("decode worker " + cluster.decode_targets[0]), std::string::npos)
      << ended.error_message();
}

// End tenants all the way down: the prefill node and the decode worker
// call the cache acting for the end tenant (kvtier-acting-for), so the
// blocks it stores are charged to it and held to its quota. Two tenants
// behind one prefill node: one writing ten times its quota never evicts
// the other's prefix; a reader's generations read the cache and store
// nothing.
TEST_F(ServingTest, EndTenantsQuotasBindThroughThePrefillNode) {
  SCOPED_TRACE(rng_.Trace());
  const testing::TempDir dir("kvtier_serving_end_tenants_");
  const std::string quota = R"({"deviceBytes": 262144, "hostBytes": 262144})";
  const testing::TestTenant service{"kvtier", "SERVICE", "acme,globex", "service-token-77c1"};
  const testing::TestTenant acme{"acme", "WRITER", "acme", "acme-token-3b8e", "", quota};
  const testing::TestTenant globex{"globex", "WRITER", "globex", "globex-token-d410", "", quota};
  const testing::TestTenant auditor{"auditor", "READER", "acme", "auditor-token-90fa"};
  const std::string tenants = (dir / "tenants.json").string();
  std::ofstream(tenants) << testing::TenantsJson({service, acme, globex, auditor});
  const std::string service_token = testing::WriteTokenFile(dir.path(), service.token);
  Cluster cluster(Tiny().dir, 1, 1, {"--tenants", tenants}, "2000",
                  {"--tenants", tenants, "--token-file", service_token});
  ASSERT_TRUE(cluster.ok());
  const auto as = [&](const testing::TestTenant& t) {
    return SetClientIdentity({.tls = {}, .token_file = testing::WriteTokenFile(dir.path(), t.token)});
  };
  // globex's prefix, then acme writing ten times its quota.
  ASSERT_TRUE(as(globex).ok());
  const std::vector<uint32_t> theirs = RandomIds(4 * kBlock + 1, rng_.engine());
  ASSERT_TRUE(cluster.Generate(Request(theirs, 2)).ok());
  ASSERT_TRUE(as(acme).ok());
  const double block =
      Scrape(cluster.cache_metrics[0], R"(kvtier_cache_tenant_used_bytes{tenant="globex",tier="device"})") / 4;
  ASSERT_GT(block, 0) << "globex's blocks were not charged to globex";
  const int prompts = static_cast<int>(10 * 2 * 262144 / (8 * block)) + 1;
  for (int i = 0; i < prompts; ++i) {
    ASSERT_TRUE(cluster.Generate(Request(RandomIds(8 * kBlock + 1, rng_.engine()), 1)).ok()) << i;
  }
  const std::string page = ScrapeMetrics(cluster.cache_metrics[0]);
  EXPECT_GT(MetricValue(page, R"(kvtier_cache_tenant_evictions_total{tenant="acme"})").value_or(0), 0) << page;
  EXPECT_LE(MetricValue(page, R"(kvtier_cache_tenant_used_bytes{tenant="acme",tier="device"})").value_or(1e18),
            262144.0);
  EXPECT_FALSE(MetricValue(page, R"(kvtier_cache_tenant_evictions_total{tenant="globex"})").has_value()) << page;
  EXPECT_LE(MetricValue(page, R"(kvtier_cache_tenant_used_bytes{tenant="kvtier",tier="device"})").value_or(0), 0)
      << "the service was charged: " << page;
  ASSERT_TRUE(as(globex).ok());
  absl::StatusOr<RemoteGeneration> again = cluster.Generate(Request(theirs, 2));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->usage.cached_tokens(), 4 * kBlock) << "acme's writes evicted globex's prefix";
  // The decode worker writes back as the end tenant too: a generation that
  // fills the prompt's fourth block as it decodes stores four blocks, and
  // the service holds none of them.
  const double stored_before = Scrape(cluster.cache_metrics[0], "kvtier_cache_blocks_stored_total");
  ASSERT_TRUE(cluster.Generate(Request(RandomIds(3 * kBlock + 5, rng_.engine()), kBlock)).ok());
  EXPECT_TRUE(testing::Eventually([&] {
    return Scrape(cluster.cache_metrics[0], "kvtier_cache_blocks_stored_total") == stored_before + 4;
  })) << "the decode worker wrote no block back";
  ExpectNothingIsTheServices(ScrapeMetrics(cluster.cache_metrics[0]));

  // A reader's generation: the same tokens as a writer's, nothing stored.
  ASSERT_TRUE(as(auditor).ok());
  const std::vector<uint32_t> prompt = RandomIds(3 * kBlock + 5, rng_.engine());
  const double stored = Scrape(cluster.cache_metrics[0], "kvtier_cache_blocks_stored_total");
  absl::StatusOr<RemoteGeneration> read = cluster.Generate(Request(prompt, 70));
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameGeneration(read->tokens, InProcess(prompt, 70), 1e-4);
  EXPECT_EQ(Scrape(cluster.cache_metrics[0], "kvtier_cache_blocks_stored_total"), stored);
  ASSERT_TRUE(SetClientIdentity({}).ok());
}

// A decode worker that hangs (SIGSTOPped: its socket still accepts) is
// given up after --decode-idle-ms of silence, and the client hears why;
// `kvtier generate` with a deadline shorter than that gets DEADLINE_EXCEEDED
// on time instead of waiting forever.
TEST_F(ServingTest, AHungDecodeWorkerIsGivenUpAndDeadlinesHold) {
  Cluster cluster(Tiny().dir, 1, 1, {}, "2000", {}, {"--decode-idle-ms", "1000"});
  ASSERT_TRUE(cluster.ok());
  const std::vector<uint32_t> prompt = RandomIds(kBlock + 5, rng_.engine());
  ASSERT_TRUE(cluster.Generate(Request(prompt, 4)).ok());
  ASSERT_EQ(kill(cluster.decoders[0]->pid(), SIGSTOP), 0);
  auto hung = std::async(std::launch::async, [&] { return cluster.Generate(Request(prompt, 4)); });
  ASSERT_EQ(hung.wait_for(std::chrono::seconds(30)), std::future_status::ready) << "the prefill node waited on";
  const absl::StatusOr<RemoteGeneration> given_up = hung.get();
  EXPECT_EQ(given_up.status().code(), absl::StatusCode::kUnavailable) << given_up.status();
  EXPECT_NE(given_up.status().message().find("no progress"), std::string::npos) << given_up.status();
  const CommandResult cli = RunCommand(std::string(KVTIER_BINARY) + " generate --target " + cluster.prefill_target +
                                       " --prompt-ids 1,2,3 --max-new-tokens 4 --deadline-ms 300");
  EXPECT_EQ(cli.exit_code, 1) << cli.output;
  EXPECT_NE(cli.output.find("DEADLINE_EXCEEDED"), std::string::npos) << cli.output;
  kill(cluster.decoders[0]->pid(), SIGCONT);
}

TEST_F(ServingTest, BadRequestsGetClearStatuses) {
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  struct Case {
    std::string name;
    std::function<void(v1::GenerateRequest&)> change;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"empty prompt", [](auto& r) { r.clear_prompt_token_ids(); }, "prompt_token_ids is empty"},
      {"id outside the vocabulary", [](auto& r) { r.add_prompt_token_ids(256); }, "outside the vocabulary"},
      {"too long", [](auto& r) { r.mutable_limits()->set_max_new_tokens(5000); }, "positions"},
      {"no tokens wanted", [](auto& r) { r.mutable_limits()->set_max_new_tokens(0); }, "max_new_tokens"},
      {"negative temperature", [](auto& r) { r.mutable_sampling()->set_temperature(-1); }, "temperature"},
      {"top_p above 1", [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); }, "top_p"},
      {"too many logprobs", [](auto& r) { r.mutable_limits()->set_top_logprobs(21); }, "top_logprobs"},
      {"stop id outside the vocabulary", [](auto& r) { r.mutable_limits()->add_stop_token_ids(999); },
       "stop_token_ids"},
      {"bad namespace", [](auto& r) { r.set_kv_namespace("a/b"); }, "kv_namespace"},
      {"request_id too long", [](auto& r) { r.set_request_id(std::string(129, 'r')); }, "request_id"},
  };
  for (const Case& c : cases) {
    v1::GenerateRequest r = Request({1, 2, 3}, 4);
    c.change(r);
    absl::StatusOr<RemoteGeneration> got = cluster.Generate(r);
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << got.status();
    EXPECT_NE(got.status().message().find(c.message), std::string::npos) << c.name << ": " << got.status();
  }
  // The decode worker checks what it is handed, too, and says what is
  // wrong (a later step would refuse some of these, but not say why).
  auto decode = v1::Decode::NewStub(MakeChannel(cluster.decode_targets[0]));
  const runtime::ModelConfig& config = Tiny().model->config();
  const kvblock::LatentLayout layout = serving::ModelLayout(
      config, *serving::ModelId(Tiny().dir, runtime::ModelType::kDeepseekV2), kernels::Codec::kBf16, kBlock);
  const std::vector<uint32_t> tokens = RandomIds(kBlock + 3, rng_.engine());  // a block and a tail of 3
  const kvblock::BlockHash first_block =
      kvblock::ComputeBlockChain("default", kvblock::LayoutId(layout), kBlock, tokens)[0];
  const size_t tail_bytes =
      3 * static_cast<size_t>(config.num_hidden_layers * (config.kv_lora_rank + config.qk_rope_head_dim)) * 4;
  auto decode_status = [&](const std::function<void(v1::DecodeRequest&)>& change) {
    v1::DecodeRequest r;
    r.set_kv_namespace("default");
    *r.mutable_layout() = kvblock::LayoutToProto(layout);
    for (uint32_t t : tokens) r.add_token_ids(t);
    r.add_block_hashes(std::string(kvblock::HashAsBytes(first_block)));
    r.mutable_tail()->set_token_count(3);
    r.mutable_tail()->set_latents(std::string(tail_bytes, '\0'));
    r.mutable_limits()->set_max_new_tokens(4);
    change(r);
    grpc::ClientContext context;
    auto reader = decode->Decode(&context, r);
    v1::DecodeResponse e;
    while (reader->Read(&e)) {
    }
    return reader->Finish();
  };
  const grpc::Status good = decode_status([](auto&) {});
  EXPECT_TRUE(good.ok()) << good.error_message();
  const kvblock::LatentLayout other_model =
      serving::ModelLayout(config, "another-model", kernels::Codec::kBf16, kBlock);
  struct DecodeCase {
    std::string name;
    std::function<void(v1::DecodeRequest&)> change;
    grpc::StatusCode code;
    std::string message;
  };
  const std::vector<DecodeCase> decode_cases = {
      {"another model's layout", [&](auto& r) { *r.mutable_layout() = kvblock::LayoutToProto(other_model); },
       grpc::StatusCode::FAILED_PRECONDITION, "the request's latents are of model another-model"},
      {"a hash too many", [](auto& r) { r.add_block_hashes(std::string(32, 'x')); }, grpc::StatusCode::INVALID_ARGUMENT,
       "block_hashes has 2 hashes"},
      {"a hash not the chain's", [](auto& r) { (*r.mutable_block_hashes(0))[7] ^= 0x01; },
       grpc::StatusCode::INVALID_ARGUMENT, "block_hashes[0] is not the chain hash"},
      {"a short tail", [](auto& r) { r.mutable_tail()->set_latents("short"); }, grpc::StatusCode::INVALID_ARGUMENT,
       "tail of 3 tokens must be"},
      {"a tail of the wrong count", [](auto& r) { r.mutable_tail()->set_token_count(2); },
       grpc::StatusCode::INVALID_ARGUMENT, "tail.token_count must be 3"},
      {"a first token outside the vocabulary", [](auto& r) { r.mutable_first_token()->set_token_id(300); },
       grpc::StatusCode::INVALID_ARGUMENT, "first_token must be"},
      {"an inline block past the blocks", [&](auto& r) { AddInlineBlock(r, 1, "x"); },
       grpc::StatusCode::INVALID_ARGUMENT, "inline block index 1 is repeated or not one of the 1 full blocks"},
      {"an inline block twice",
       [&](auto& r) {
         AddInlineBlock(r, 0, "x");
         AddInlineBlock(r, 0, "y");
       },
       grpc::StatusCode::INVALID_ARGUMENT, "inline block index 0 is repeated"},
      {"an inline block that is none", [&](auto& r) { AddInlineBlock(r, 0, "not a block"); },
       grpc::StatusCode::INVALID_ARGUMENT, "inline block 0: block record truncated"},
      {"a restore point", [](auto& r) { r.set_restore_point("point"); }, grpc::StatusCode::INVALID_ARGUMENT,
       "restore_point is for DeepSeek-V4 layouts only"},
  };
  for (const DecodeCase& c : decode_cases) {
    const grpc::Status got = decode_status(c.change);
    EXPECT_EQ(got.error_code(), c.code) << c.name << ": " << got.error_message();
    EXPECT_NE(got.error_message().find(c.message), std::string::npos) << c.name << ": " << got.error_message();
  }
}

// The model servers' memory and device flags: a device that is not one,
// pool sizes that are not sizes, and CUDA where it cannot run are refused
// at start-up with a message (2: a usage error; 1: cannot run here).
// Addresses that nothing can be called at are refused at start, not
// served around: a port out of range for a cache shard or a decode worker.
// So is a prefill concurrency of none, or of more threads than it may start.
TEST_F(ServingTest, ModelServersRefuseAddressesNobodyCouldListenOn) {
  const std::string common = " --listen 127.0.0.1:0 --metrics-listen '' --model " + Tiny().dir;
  const std::pair<std::string, std::string> cases[] = {
      {KVTIER_DECODE_BINARY + common + " --cache 127.0.0.1:99999", "--cache: address '127.0.0.1:99999'"},
      {KVTIER_DECODE_BINARY + common + " --cache 127.0.0.1:0", "port 1-65535"},
      {KVTIER_PREFILL_BINARY + common + " --cache 127.0.0.1:1 --decode :7072", "--decode: address ':7072'"},
      {KVTIER_PREFILL_BINARY + common + " --cache 127.0.0.1:1 --decode 127.0.0.1:2 --max-concurrent-prefills 0",
       "--max-concurrent-prefills must be in 1..1024"},
      {KVTIER_PREFILL_BINARY + common + " --cache 127.0.0.1:1 --decode 127.0.0.1:2 --max-concurrent-prefills 1025",
       "--max-concurrent-prefills must be in 1..1024"},
  };
  for (const auto& [command, why] : cases) {
    const CommandResult r = RunCommand(command);
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
    EXPECT_NE(r.output.find(why), std::string::npos) << command << "\n" << r.output;
  }
}

// How a model server is to serve (--listen, --health-listen, --drain-ms,
// --tls-dir's files, --metrics-listen) is checked before its model loads,
// which for a published checkpoint takes minutes: a mistake there is said
// at once, exit 2, with nothing loaded. A --model that is not there is
// said alone, before the shards are called (and found unreachable).
TEST_F(ServingTest, ModelServersCheckHowTheyServeBeforeLoadingTheModel) {
  const testing::TempDir dir("kvtier_serving_serve_flags_");
  const std::string no_tls = (dir / "missing").string();
  const std::pair<std::string, std::string> cases[] = {
      {"--listen nowhere", "--listen: address 'nowhere' is not HOST:PORT"},
      {"--health-listen 127.0.0.1:70000", "--health-listen: address '127.0.0.1:70000' is not HOST:PORT"},
      {"--drain-ms 600001", "--drain-ms 600001: must be 0 to 600000"},
      {"--tls-dir " + no_tls, "--tls-dir: cannot read " + no_tls + "/ca.crt"},
      {"--metrics-listen 127.0.0.1:99999", "--metrics-listen: address '127.0.0.1:99999' is not HOST:PORT"},
  };
  const std::pair<std::string, std::string> programs[] = {
      {"kvtier-decode", std::string(KVTIER_DECODE_BINARY) + " "},
      {"kvtier-prefill", std::string(KVTIER_PREFILL_BINARY) + " --decode 127.0.0.1:1 "}};
  for (const auto& [program, start] : programs) {
    for (const auto& [flags, why] : cases) {
      const std::string command =
          start + "--listen 127.0.0.1:0 --metrics-listen '' --model " + Tiny().dir + " --cache 127.0.0.1:1 " + flags;
      const CommandResult r = RunCommand(command);
      EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
      EXPECT_NE(r.output.find(why), std::string::npos) << command << "\n" << r.output;
      EXPECT_EQ(r.output.find("loading"), std::string::npos) << command << "\n" << r.output;
    }
    const std::string no_model = (dir / "no-model").string();
    const CommandResult r =
        RunCommand(start + "--listen 127.0.0.1:0 --metrics-listen '' --cache 127.0.0.1:1 --model " + no_model);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_EQ(r.output, program + ": cannot read " + no_model + "/config.json\n");
  }
}

// Each usage mistake of a model server's own flags is said alone, exit 2,
// before anything starts.
TEST_F(ServingTest, ModelServersSayEachUsageMistakeAlone) {
  const std::string decode = std::string(KVTIER_DECODE_BINARY) + " --listen 127.0.0.1:0 --metrics-listen '' ";
  const std::string prefill = std::string(KVTIER_PREFILL_BINARY) + " --listen 127.0.0.1:0 --metrics-listen '' ";
  const std::string model = "--model " + Tiny().dir + " --cache 127.0.0.1:1 ";
  const std::string both = model + "--decode 127.0.0.1:2 ";
  const std::tuple<std::string, std::string, std::string> cases[] = {
      {"kvtier-decode", decode + "--model " + Tiny().dir, "--model and --cache are required"},
      {"kvtier-decode", decode + "--cache 127.0.0.1:1", "--model and --cache are required"},
      {"kvtier-decode", decode + model + "--max-batch 0", "--max-batch and --max-sequences must be positive"},
      {"kvtier-decode", decode + model + "--max-sequences 0", "--max-batch and --max-sequences must be positive"},
      {"kvtier-decode", decode + model + "--threads 1025", "--threads must be at most 1024"},
      {"kvtier-decode", decode + model + "--watch-interval-ms 0", "--watch-interval-ms must be positive"},
      {"kvtier-prefill", prefill + model, "--decode is required"},
      {"kvtier-prefill", prefill + both + "--decode-idle-ms 0", "--decode-idle-ms must be positive"},
      {"kvtier-prefill", prefill + both + "--max-generations-per-tenant 0",
       "--max-generations-per-tenant and --max-generations-per-client must be positive"},
      {"kvtier-prefill", prefill + both + "--max-generations-per-client 0",
       "--max-generations-per-tenant and --max-generations-per-client must be positive"},
      {"kvtier-prefill", prefill + both + "--kv-codec int3", "--kv-codec int3 is not one of bf16, fp8, int8, int4"},
      {"kvtier-prefill", prefill + both + "--tokens-per-block 0", "--tokens-per-block must be in 1..4096"},
      {"kvtier-prefill", prefill + both + "--tokens-per-block 4097", "--tokens-per-block must be in 1..4096"},
      {"kvtier-prefill", prefill + both + "--threads 1025", "--threads must be at most 1024"},
  };
  for (const auto& [program, command, why] : cases) {
    const CommandResult r = RunCommand(command);
    EXPECT_EQ(r.exit_code, 2) << command << "\n" << r.output;
    EXPECT_EQ(r.output, program + ": " + why + "\n") << command;
  }
}

// A decode worker handed a V4 sequence directly: one whose blocks the
// cache never had is recomputed from its tokens (and generates what the
// runtime does); a request without its point, with a damaged point, a
// block record where the point should be, a tail, or an inline block
// damaged or of the wrong kind is INVALID_ARGUMENT, saying which.
void ExpectV4DecodeRequestsChecked(const PresetModel& m, Cluster& cluster, std::mt19937_64& rng) {
  constexpr uint32_t kV4Block = 16;
  const runtime::Model& model = *m.model;
  const kvblock::LatentLayout layout = serving::ModelLayout(
      m.config, *serving::ModelId(m.dir(), runtime::ModelType::kDeepseekV4), kernels::Codec::kFp8, kV4Block);
  const std::vector<uint32_t> tokens = RandomIds(3 * kV4Block + 3, rng);
  runtime::SequenceCache cache = model.NewCache(kernels::Codec::kFp8, kV4Block);
  std::vector<float> logits(static_cast<size_t>(m.config.vocab_size));
  ASSERT_TRUE(model.Prefill(std::span(tokens).first(3 * kV4Block), cache, logits).ok());
  absl::StatusOr<std::string> point = serving::V4RestorePointRecord(m.config, layout, cache);
  ASSERT_TRUE(point.ok()) << point.status();
  absl::StatusOr<std::string> block = serving::V4BlockRecord(m.config, layout, cache, 0);
  ASSERT_TRUE(block.ok()) << block.status();
  const std::vector<runtime::Sampled> want = GreedyAfter(model, tokens, 0, 5);
  v1::DecodeRequest good;
  good.set_kv_namespace("direct-v4");
  *good.mutable_layout() = kvblock::LayoutToProto(layout);
  for (uint32_t t : tokens) good.add_token_ids(t);
  for (const kvblock::BlockHash& h :
       kvblock::ComputeBlockChain("direct-v4", kvblock::LayoutId(layout), kV4Block, tokens))
    good.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
  good.set_restore_point(*point);
  good.mutable_first_token()->set_token_id(want[0].token);
  good.mutable_limits()->set_max_new_tokens(5);
  auto decode = v1::Decode::NewStub(MakeChannel(cluster.decode_targets[0]));
  std::vector<uint32_t> got;
  const auto run = [&](const v1::DecodeRequest& r) {
    got.clear();
    grpc::ClientContext context;
    auto reader = decode->Decode(&context, r);
    v1::DecodeResponse e;
    while (reader->Read(&e)) {
      if (e.has_token()) got.push_back(e.token().token_id());
    }
    return reader->Finish();
  };
  const double recomputed = Scrape(cluster.decode_metrics[0], "kvtier_decode_blocks_recomputed_total");
  const grpc::Status ok = run(good);
  ASSERT_TRUE(ok.ok()) << ok.error_message();
  ASSERT_EQ(got.size(), 4u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i + 1].token) << "token " << i + 1;
  EXPECT_EQ(Scrape(cluster.decode_metrics[0], "kvtier_decode_blocks_recomputed_total"), recomputed + 3);

  std::string damaged_block = *block;
  damaged_block[damaged_block.size() / 2] ^= 0x10;
  const std::pair<std::function<void(v1::DecodeRequest&)>, std::string> bad[] = {
      {[](auto& r) { r.clear_restore_point(); }, "restore_point must be the record after the first 3 blocks"},
      {[&](auto& r) { (*r.mutable_restore_point())[point->size() / 2] ^= 0x10; },
       "restore_point: block checksum mismatch"},
      {[&](auto& r) { r.set_restore_point(*block); }, "restore_point: a block record where a restore point"},
      {[](auto& r) { r.mutable_tail()->set_token_count(3); }, "a DeepSeek-V4 request carries no tail"},
      {[&](auto& r) { AddInlineBlock(r, 0, damaged_block); }, "inline block 0: block checksum mismatch"},
      {[&](auto& r) { AddInlineBlock(r, 1, *point); }, "inline block 1: a restore point record where a block"},
  };
  for (const auto& [change, message] : bad) {
    v1::DecodeRequest r = good;
    change(r);
    const grpc::Status got = run(r);
    EXPECT_EQ(got.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << message << ": " << got.error_message();
    EXPECT_NE(got.error_message().find(message), std::string::npos) << message << ": " << got.error_message();
  }
}

// DeepSeek-V4 (v4-tiny: a window of 16, ratios 4 and 8) through the
// services, blocks of 16: the prefill node restores the longest cached
// prefix that ends at a restore point, and the decode worker continues from
// the point at the prompt's last boundary; V4's passes give the same
// results however a sequence is cut, so every turn equals `kvtier run` of
// the whole sequence exactly. A second turn restores from the prefill's
// point; the conversation's next turn from the point the decode worker
// stored as its generation ended; the same over two shards (each point
// beside its block, the prefix combined from both); with the shard gone the
// blocks travel inline.
TEST_F(ServingTest, DeepSeekV4ContinuesFromRestorePointsExactly) {
  SCOPED_TRACE(rng_.Trace());
  const PresetModel m("v4-tiny", rng_.seed());
  constexpr uint32_t kV4Block = 16;
  for (const int shards : {2, 1}) {
    SCOPED_TRACE(::testing::Message() << shards << " shard(s)");
    Cluster cluster(m.dir(), shards, 1, {}, "2000", {},
                    {"--kv-codec", "fp8", "--tokens-per-block", std::to_string(kV4Block)});
    ASSERT_TRUE(cluster.ok());
    // Six blocks before the prompt's last boundary: over two shards, both
    // hold some (but for 1 seed in 32).
    const std::vector<uint32_t> prompt = RandomIds(6 * kV4Block + 5, rng_.engine());
    ExpectGenerateAsRun(m.dir(), cluster.prefill_target, prompt, 20);

    absl::StatusOr<RemoteGeneration> hit = cluster.Generate(Request(prompt, 20));
    ASSERT_TRUE(hit.ok()) << hit.status();
    EXPECT_EQ(hit->usage.cached_tokens(), 6 * kV4Block);
    const std::vector<runtime::Sampled> want = GreedyAfter(*m.model, prompt, 0, 20);
    ExpectSameGeneration(hit->tokens, want, 1e-6);

    // The next turn: the prompt, what was generated, new ids. The worker
    // ran the sequence past 112 tokens, so it stored block 6 and the point
    // after it.
    std::vector<uint32_t> next = prompt;
    for (const runtime::Sampled& t : want) next.push_back(t.token);
    for (uint32_t t : RandomIds(10, rng_.engine())) next.push_back(t);
    absl::StatusOr<RemoteGeneration> turn = cluster.Generate(Request(next, 6));
    ASSERT_TRUE(turn.ok()) << turn.status();
    EXPECT_EQ(turn->usage.cached_tokens(), 7 * kV4Block);
    ExpectSameGeneration(turn->tokens, GreedyAfter(*m.model, next, 0, 6), 1e-6);
    EXPECT_GE(Scrape(cluster.decode_metrics[0], "kvtier_decode_blocks_written_back_total"), 1.0);
    EXPECT_EQ(Scrape(cluster.decode_metrics[0], "kvtier_decode_blocks_recomputed_total"), 0.0);
    if (shards > 1) continue;
    ExpectV4DecodeRequestsChecked(m, cluster, rng_.engine());

    // Two prompts that share 9 blocks, which neither ends at: the first
    // stored a point after block 8 as well (--restore-every's default), so
    // the second restores 8 blocks.
    const std::vector<uint32_t> shared = RandomIds(9 * kV4Block, rng_.engine());
    std::vector<uint32_t> a = shared, b = shared;
    for (uint32_t t : RandomIds(20, rng_.engine())) a.push_back(t);
    for (uint32_t t : RandomIds(30, rng_.engine())) b.push_back(t);
    ASSERT_TRUE(cluster.Generate(Request(a, 2)).ok());
    absl::StatusOr<RemoteGeneration> sharing = cluster.Generate(Request(b, 4));
    ASSERT_TRUE(sharing.ok()) << sharing.status();
    EXPECT_EQ(sharing->usage.cached_tokens(), 8 * kV4Block);
    ExpectSameGeneration(sharing->tokens, GreedyAfter(*m.model, b, 0, 4), 1e-6);

    cluster.caches[0].reset();  // the shard is gone: blocks and point travel with the request
    const std::vector<uint32_t> fresh = RandomIds(3 * kV4Block + 1, rng_.engine());
    absl::StatusOr<RemoteGeneration> alone = cluster.Generate(Request(fresh, 5));
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(alone->usage.cached_tokens(), 0u);
    ExpectSameGeneration(alone->tokens, GreedyAfter(*m.model, fresh, 0, 5), 1e-6);
    EXPECT_GE(Scrape(cluster.decode_metrics[0], "kvtier_decode_blocks_inline_total"), 3.0);
  }

  // A prefill node refuses what it cannot store V4 in.
  const std::string prefill = std::string(KVTIER_PREFILL_BINARY) +
                              " --decode 127.0.0.1:1 --listen 127.0.0.1:0 --model " + m.dir() +
                              " --cache 127.0.0.1:1 --metrics-listen '' ";
  const CommandResult int8 = RunCommand(prefill + "--kv-codec int8");
  EXPECT_EQ(int8.exit_code, 2) << int8.output;
  EXPECT_NE(int8.output.find("--kv-codec int8: a DeepSeek-V4 model's entries are stored in its own FP8"),
            std::string::npos)
      << int8.output;
  const CommandResult blocks = RunCommand(prefill + "--tokens-per-block 12");
  EXPECT_EQ(blocks.exit_code, 2) << blocks.output;
  EXPECT_NE(blocks.output.find("is not a multiple of every compress ratio (up to 8)"), std::string::npos)
      << blocks.output;
  for (const CommandResult* r : {&int8, &blocks}) {
    EXPECT_EQ(r->output.find("loading"), std::string::npos) << "said before the weights load: " << r->output;
  }

  // `kvtier up` runs its conversation on it; the second turn restores.
  const CommandResult up =
      RunCommand(std::string(KVTIER_BINARY) + " up --preset v4-tiny --max-new-tokens 8 --dir " + m.dir() + "/up");
  EXPECT_EQ(up.exit_code, 0) << up.output;
  EXPECT_NE(up.output.find("turn 2: 324 prompt tokens, 256 from the cache"), std::string::npos) << up.output;
}

// DeepSeek-V4 behind tenants: the prefill node stores a prompt's blocks
// and points, and reads them back, as the end tenant; none are the
// service's.
TEST_F(ServingTest, DeepSeekV4BlocksAreTheEndTenants) {
  SCOPED_TRACE(rng_.Trace());
  const PresetModel m("v4-tiny", rng_.seed());
  constexpr uint32_t kV4Block = 16;
  const testing::TempDir dir("kvtier_serving_v4_tenants_");
  const testing::TestTenant service{"kvtier", "SERVICE", "acme", "service-token-4f0a"};
  const testing::TestTenant acme{"acme", "WRITER", "acme", "acme-token-62be"};
  const std::string tenants = (dir / "tenants.json").string();
  std::ofstream(tenants) << testing::TenantsJson({service, acme});
  Cluster cluster(m.dir(), 1, 1, {"--tenants", tenants}, "2000",
                  {"--tenants", tenants, "--token-file", testing::WriteTokenFile(dir.path(), service.token)},
                  {"--kv-codec", "fp8", "--tokens-per-block", std::to_string(kV4Block)});
  ASSERT_TRUE(cluster.ok());
  ASSERT_TRUE(SetClientIdentity({.tls = {}, .token_file = testing::WriteTokenFile(dir.path(), acme.token)}).ok());
  const std::vector<uint32_t> prompt = RandomIds(3 * kV4Block + 5, rng_.engine());
  ASSERT_TRUE(cluster.Generate(Request(prompt, 4)).ok());
  absl::StatusOr<RemoteGeneration> again = cluster.Generate(Request(prompt, 4));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->usage.cached_tokens(), 3 * kV4Block);
  const std::string page = ScrapeMetrics(cluster.cache_metrics[0]);
  EXPECT_GT(MetricValue(page, R"(kvtier_cache_tenant_used_bytes{tenant="acme",tier="device"})").value_or(0), 0) << page;
  EXPECT_GT(MetricValue(page, R"(kvtier_cache_tenant_hits_total{tenant="acme"})").value_or(0), 0) << page;
  ExpectNothingIsTheServices(page);
  ASSERT_TRUE(SetClientIdentity({}).ok());
}

// Every binary says its version; a stopped model server says who it is.
TEST_F(ServingTest, BinariesSayTheirVersionAndTheirNameWhenStopped) {
  for (const auto& [binary, name] : {std::pair{std::string(KVTIER_CACHE_BINARY), "kvtier-cache"},
                                     {std::string(KVTIER_DECODE_BINARY), "kvtier-decode"},
                                     {std::string(KVTIER_PREFILL_BINARY), "kvtier-prefill"},
                                     {std::string(KVTIER_BINARY), "kvtier"},
                                     {std::string(KVTIER_BINARY) + " run", "kvtier"}}) {
    const CommandResult r = RunCommand(binary + " --version");
    EXPECT_EQ(r.exit_code, 0) << binary;
    EXPECT_EQ(r.output, std::string(name) + " 0.1.0\n") << binary;
  }
  const std::string common = " --listen 127.0.0.1:0 --metrics-listen '' --model " + Tiny().dir + " --cache 127.0.0.1:1";
  for (const auto& [command, name] : {std::pair{KVTIER_DECODE_BINARY + common, "kvtier-decode"},
                                      {KVTIER_PREFILL_BINARY + common + " --decode 127.0.0.1:2", "kvtier-prefill"}}) {
    // SIGTERM waits, blocked, until the server asks for it. Sent once main
    // has blocked it (0x4000 in SigBlk; at most 10 s on), still loading the
    // model: a fixed sleep could land before main on a loaded machine,
    // where the default action ends the process.
    const CommandResult r =
        RunCommand("{ " + command +
                   " > /dev/null & pid=$!; n=0; "
                   "while [ $n -lt 1000 ] && kill -0 $pid 2>/dev/null && "
                   "! grep -Eq '^SigBlk:[[:space:]]*[0-9a-f]*[4567cdef][0-9a-f]{3}$' /proc/$pid/status 2>/dev/null; "
                   "do n=$((n + 1)); sleep 0.01; done; "
                   "kill -TERM $pid; wait $pid; }");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(std::string(name) + ": received SIGTERM: draining in-flight RPCs"), std::string::npos)
        << r.output;
  }
}

TEST_F(ServingTest, ModelServersRefuseFlagsTheyCannotHonour) {
  for (const std::string& start :
       {std::string(KVTIER_DECODE_BINARY) + " ", std::string(KVTIER_PREFILL_BINARY) + " --decode 127.0.0.1:1 "}) {
    const std::string command =
        start + "--listen 127.0.0.1:0 --model " + Tiny().dir + " --cache 127.0.0.1:1 --metrics-listen '' ";
    const CommandResult not_a_device = RunCommand(command + "--device tpu");
    EXPECT_EQ(not_a_device.exit_code, 2) << not_a_device.output;
    EXPECT_NE(not_a_device.output.find("--device tpu is not one of cpu, cuda"), std::string::npos)
        << not_a_device.output;
    const CommandResult not_a_size = RunCommand(command + "--device cuda --device-block-pool 12XB");
    EXPECT_EQ(not_a_size.exit_code, 2) << not_a_size.output;
    EXPECT_NE(not_a_size.output.find("--device-block-pool"), std::string::npos) << not_a_size.output;
    if (start.find("prefill") != std::string::npos) {
      const CommandResult too_many = RunCommand(command + "--max-top-logprobs 257");
      EXPECT_EQ(too_many.exit_code, 2) << too_many.output;
      EXPECT_NE(too_many.output.find("--max-top-logprobs 257 exceeds the model's vocabulary of 256"), std::string::npos)
          << too_many.output;
      EXPECT_EQ(too_many.output.find("loading"), std::string::npos) << "said before the weights load";
    }
    const CommandResult not_a_pool = RunCommand(command + "--record-pool 12XB");
    EXPECT_EQ(not_a_pool.exit_code, 2) << not_a_pool.output;
    EXPECT_NE(not_a_pool.output.find("--record-pool: '12XB'"), std::string::npos) << not_a_pool.output;
    const CommandResult too_many_streams = RunCommand(command + "--cache-fetch-streams 5");
    EXPECT_EQ(too_many_streams.exit_code, 2) << too_many_streams.output;
    EXPECT_NE(too_many_streams.output.find("--cache-fetch-streams must be 0 to 4"), std::string::npos)
        << too_many_streams.output;
#if KVTIER_RUNTIME_CUDA
    std::string why;
    if (kernels::cuda::DevicePresent(&why)) continue;  // cuda_forward_test runs it
#endif
    const CommandResult no_gpu = RunCommand(command + "--device cuda");
    EXPECT_EQ(no_gpu.exit_code, 1) << no_gpu.output;
    EXPECT_NE(no_gpu.output.find("--device cuda"), std::string::npos) << no_gpu.output;
  }
}

// The alerting rules and the Grafana dashboard in deploy/ name only metrics
// the three servers really export (scraped after a prompt was generated
// twice, by a tenant with a quota), promtool accepts the rules, and every dashboard
// query has data in a real Prometheus that scrapes the servers.
TEST_F(ServingTest, DeployedRulesAndDashboardUseExportedMetrics) {
  const testing::TempDir dir("kvtier_serving_dashboard_");
  const testing::TestTenant service{"kvtier", "SERVICE", "acme", "service-token-77f0"};
  testing::TestTenant acme{"acme", "WRITER", "acme", "acme-token-3a9e"};
  acme.quota = R"({"deviceBytes": 1073741824, "hostBytes": 1073741824})";
  const std::string tenants = (dir / "tenants.json").string();
  std::ofstream(tenants) << testing::TenantsJson({service, acme});
  Cluster cluster(Tiny().dir, 1, 1, {"--tenants", tenants}, "2000",
                  {"--tenants", tenants, "--token-file", testing::WriteTokenFile(dir.path(), service.token)});
  ASSERT_TRUE(cluster.ok());
  ASSERT_TRUE(SetClientIdentity({.tls = {}, .token_file = testing::WriteTokenFile(dir.path(), acme.token)}).ok());
  const v1::GenerateRequest request = Request(RandomIds(2 * kBlock + 3, rng_.engine()), 4);
  ASSERT_TRUE(cluster.Generate(request).ok());
  ASSERT_TRUE(cluster.Generate(request).ok());  // hits
  std::set<std::string> exported;
  for (const std::string& address : {cluster.cache_metrics[0], cluster.decode_metrics[0], cluster.prefill_metrics}) {
    const CommandResult scrape = RunCommand("curl -sf http://" + address + "/metrics");
    ASSERT_EQ(scrape.exit_code, 0) << address;
    std::istringstream lines(scrape.output);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty() && line[0] != '#') exported.insert(line.substr(0, line.find_first_of("{ ")));
    }
  }
  const std::regex metric("kvtier_[a-z0-9_]+");
  for (const char* file : {"prometheus/rules.yml", "grafana/kvtier-dashboard.json"}) {
    std::ifstream in(std::string(KVTIER_DEPLOY_DIR) + "/" + file);
    ASSERT_TRUE(in) << file;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t names = 0;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), metric); it != std::sregex_iterator();
         ++it, ++names) {
      // Exported only with --tls-dir: SecurityTest checks them on a TLS server.
      if (it->str().starts_with("kvtier_tls_")) continue;
      EXPECT_TRUE(exported.contains(it->str())) << file << " uses " << it->str() << ", which no server exports";
    }
    EXPECT_GT(names, 5u) << file;
  }
  const CommandResult check =
      RunCommand("promtool check rules " + std::string(KVTIER_DEPLOY_DIR) + "/prometheus/rules.yml");
  EXPECT_EQ(check.exit_code, 0) << check.output;

  // A real Prometheus with the rules scrapes the three servers; every
  // dashboard query (its variables at "All", the tier at "host") then runs
  // and has data, as it would in Grafana.
  testing::PrometheusServer prometheus({cluster.cache_metrics[0], cluster.decode_metrics[0], cluster.prefill_metrics},
                                       {std::string(KVTIER_DEPLOY_DIR) + "/prometheus/rules.yml"});
  ASSERT_FALSE(prometheus.address().empty());
  ASSERT_TRUE(prometheus.ValueOf("up").has_value());
  ASSERT_TRUE(cluster.Generate(request).ok());  // between two scrapes
  std::ifstream in(std::string(KVTIER_DEPLOY_DIR) + "/grafana/kvtier-dashboard.json");
  const nlohmann::json dashboard = nlohmann::json::parse(in);
  size_t queries = 0;
  for (const nlohmann::json& panel : dashboard["panels"]) {
    for (const nlohmann::json& target : panel.value("targets", nlohmann::json::array())) {
      std::string expr = target["expr"];
      expr = absl::StrReplaceAll(expr, {{"$cache", ".*"}, {"$worker", ".*"}, {"$tenant", ".*"}, {"$tier", "host"}});
      SCOPED_TRACE(panel["title"].get<std::string>() + ": " + expr);
      ++queries;
      std::optional<nlohmann::json> answer = prometheus.QueryUntilPresent(expr, std::chrono::seconds(20));
      ASSERT_TRUE(answer.has_value());
      EXPECT_EQ((*answer)["status"], "success") << answer->dump();
      EXPECT_FALSE((*answer)["data"]["result"].empty()) << "no data";
    }
  }
  EXPECT_GT(queries, 30u);
  // The template variables' label_values() queries find their values.
  for (const nlohmann::json& variable : dashboard["templating"]["list"]) {
    if (variable["type"] != "query") continue;
    const std::string definition = variable["definition"];
    const std::regex label_values(R"(label_values\((.*), (\w+)\))");
    std::smatch m;
    ASSERT_TRUE(std::regex_match(definition, m, label_values)) << definition;
    std::optional<nlohmann::json> answer =
        prometheus.QueryUntilPresent("count by (" + m[2].str() + ") (" + m[1].str() + ")");
    ASSERT_TRUE(answer.has_value());
    EXPECT_FALSE((*answer)["data"]["result"].empty()) << definition;
  }
  ASSERT_TRUE(SetClientIdentity({}).ok());
}

// A client whose target names several prefill nodes (as a headless
// Service's DNS name does; here gRPC's ipv4: list) spreads its requests
// over all of them, not only the first it connected to.
TEST_F(ServingTest, ClientsSpreadRequestsOverEveryPrefillNode) {
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  std::string second_metrics, second_target;
  std::unique_ptr<ChildProcess> second = Cluster::Start(
      {KVTIER_PREFILL_BINARY, "--listen", "127.0.0.1:0", "--model", Tiny().dir, "--cache", cluster.cache_targets[0],
       "--decode", cluster.decode_targets[0], "--metrics-listen", "127.0.0.1:0"},
      second_metrics, second_target);
  ASSERT_FALSE(second_target.empty());
  // One long-lived channel, as a client keeps.
  auto stub = v1::Prefill::NewStub(MakeChannel("ipv4:" + cluster.prefill_target + "," + second_target));
  constexpr int kRequests = 10;
  for (int i = 0; i < kRequests; ++i) {
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    auto reader = stub->Generate(&context, Request(RandomIds(20, rng_.engine()), 2));
    v1::GenerateResponse event;
    while (reader->Read(&event)) {
    }
    ASSERT_TRUE(reader->Finish().ok());
  }
  const double first = Scrape(cluster.prefill_metrics, "kvtier_prefill_requests_total{code=\"OK\"}");
  const double other = Scrape(second_metrics, "kvtier_prefill_requests_total{code=\"OK\"}");
  EXPECT_EQ(first + other, kRequests);
  // Round-robin once both are connected: the first call or two may find
  // only one ready.
  EXPECT_GE(first, 3.0);
  EXPECT_GE(other, 3.0);
}

// Every server says what it is and what the process uses; both model
// servers count requests by status code, named as the cache names them.
TEST_F(ServingTest, EveryServerExportsBuildAndProcessMetricsAndNamedCodes) {
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  ASSERT_TRUE(cluster.Generate(Request(RandomIds(100, rng_.engine()), 4)).ok());
  v1::GenerateRequest bad = Request({}, 4);  // an empty prompt: INVALID_ARGUMENT
  EXPECT_EQ(cluster.Generate(bad).status().code(), absl::StatusCode::kInvalidArgument);
  for (const auto& [address, program] : {std::pair{cluster.cache_metrics[0], "kvtier-cache"},
                                         {cluster.decode_metrics[0], "kvtier-decode"},
                                         {cluster.prefill_metrics, "kvtier-prefill"}}) {
    SCOPED_TRACE(program);
    EXPECT_EQ(Scrape(address, absl::StrCat("kvtier_build_info{program=\"", program, "\",version=\"0.1.0\"}")), 1.0);
    EXPECT_GT(Scrape(address, "process_resident_memory_bytes"), 1e6);
    EXPECT_GT(Scrape(address, "process_open_fds"), 3.0);
    EXPECT_GE(Scrape(address, "process_cpu_seconds_total"), 0.0);
  }
  // The prefill node answers once the worker's finished event arrives; the
  // worker counts its call when it sends the status after it, a moment on.
  const std::string decode_ok = "kvtier_decode_requests_total{code=\"OK\"}";
  EXPECT_TRUE(testing::Eventually([&] { return Scrape(cluster.decode_metrics[0], decode_ok) >= 1.0; }));
  EXPECT_EQ(Scrape(cluster.decode_metrics[0], decode_ok), 1.0);
  EXPECT_EQ(Scrape(cluster.prefill_metrics, "kvtier_prefill_requests_total{code=\"OK\"}"), 1.0);
  EXPECT_EQ(Scrape(cluster.prefill_metrics, "kvtier_prefill_requests_total{code=\"INVALID_ARGUMENT\"}"), 1.0);
}

// gRPC turns SO_REUSEPORT on by default, so a second server on a port in
// use used to say `listening on` and share it with the first. Every server
// must instead refuse the port, say why, and exit non-zero; so must a
// metrics port in use.
TEST_F(ServingTest, EveryServerRefusesAPortAlreadyInUse) {
  Cluster cluster(Tiny().dir, 1, 1);
  ASSERT_TRUE(cluster.ok());
  const std::string taken = cluster.cache_targets[0];
  const std::string cache = std::string(KVTIER_CACHE_BINARY) + " --device-capacity 16MiB --host-capacity 16MiB";
  const std::string model = " --model " + Tiny().dir + " --cache " + taken;
  struct Case {
    std::string command;
    std::string message;
  };
  const std::vector<Case> cases = {
      {cache + " --listen " + taken, "cannot listen on " + taken + ": Address already in use"},
      {std::string(KVTIER_DECODE_BINARY) + " --listen " + taken + model,
       "cannot listen on " + taken + ": Address already in use"},
      {std::string(KVTIER_PREFILL_BINARY) + " --listen " + taken + model + " --decode " + cluster.decode_targets[0] +
           " --kv-codec bf16",
       "cannot listen on " + taken + ": Address already in use"},
      {cache + " --listen 127.0.0.1:0 --metrics-listen " + cluster.cache_metrics[0],
       "--metrics-listen: cannot serve metrics on " + cluster.cache_metrics[0] + ": Address already in use"},
  };
  for (const Case& c : cases) {
    // `timeout`: a server that took the port would otherwise serve on.
    const CommandResult r = RunCommand("timeout 30 " + c.command);
    EXPECT_NE(r.exit_code, 0) << c.command;
    EXPECT_NE(r.exit_code, 124) << c.command << " kept serving on a port in use";
    EXPECT_EQ(r.output.find("listening on"), std::string::npos) << c.command << "\n" << r.output;
    EXPECT_NE(r.output.find(c.message), std::string::npos) << c.command << "\n" << r.output;
  }
  // The first cache still answers, alone on its port.
  EXPECT_GT(cluster.CacheStats(0).tiers_size(), 0);
}

}  // namespace
}  // namespace kvtier
