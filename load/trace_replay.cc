// Prefix hit rate per GiB: replays a request trace (Mooncake's JSON lines,
// load/trace/trace.h; load/trace_gen.py makes one) against a real
// kvtier-cache for every layout and memory budget asked for, and reports
// the token-weighted prefix hit rate beside the trace's ceiling.
//
//   trace_replay --trace T.jsonl --layouts expanded,bf16,int8,int4
//                --budgets 64MiB,256MiB,1GiB [--model v3.2] [--layers 27] [--json]
//   trace_replay --trace T.jsonl --model v4-flash --layouts fp8 --budgets ...
//
// Each (eviction, layout, budget) gets a fresh cache whose device tier (in
// host memory) is the budget; its host tier is one page, so what does not
// fit is evicted. Layouts are the attention of --model (V2-Lite's 27
// layers, V3's, V3.2's or Kimi-K2's 61: 512 + 64 latents a token and
// layer; 16, 128 or 64 heads of 128 + 64 K and 128 V expanded; V3.2 adds
// its indexer's key, 128 FP8 codes and a scale, to every layout), with
// --layers of its layers: fewer scale a run down, and the budgets with it.
// DeepSeek-V4-Flash (v4-flash) has one layout, its own: blocks of
// compressed entries and indexer keys, and restore points (block format
// 3), at 43 layers or the first --layers of its schedule.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "kvtier/kernels/codec.h"
#include "load/bench_layout.h"
#include "load/trace/replay.h"
#include "services/base/byte_size.h"
#include "services/base/child_process.h"
#include "services/base/flags.h"
#include "services/base/status.h"
#include "services/kvblock/block_format.h"
#include "services/rpc/client_identity.h"

namespace kvtier::load {
namespace {

// The attention shapes a trace is replayed for: each layer caches 512 + 64
// latent values a token, or, expanded, 128 + 64 K and 128 V values a head;
// and, for DeepSeek-V3.2, its indexer's key of indexer_dim values.
struct ModelShape {
  std::string name;
  uint32_t layers;
  uint32_t heads;
  uint32_t indexer_dim = 0;
  bool v4 = false;
};
const std::vector<ModelShape>& ModelShapes() {
  static const auto* shapes = new std::vector<ModelShape>{{"v2-lite", 27, 16},
                                                          {"v3", 61, 128},
                                                          {"v3.2", 61, 128, 128},
                                                          {"kimi-k2", 61, 64},
                                                          {"v4-flash", 43, 64, 128, true}};
  return *shapes;
}

// DeepSeek-V4-Flash's first `layers` layers (bench_layout.h), in its own FP8 only.
absl::StatusOr<kvblock::LatentLayout> V4FlashLayout(const std::string& name, uint32_t layers,
                                                    uint32_t tokens_per_block) {
  if (name != "fp8") {
    return absl::InvalidArgumentError(
        absl::StrCat("layout '", name, "': v4-flash stores its entries in its own FP8 (--layouts fp8)"));
  }
  const kvblock::LatentLayout layout = V4Flash("trace-replay-v4-flash", layers, tokens_per_block);
  KVTIER_RETURN_IF_ERROR(kvblock::ValidateLayout(layout));
  return layout;
}

// A layer of `model` as `name` stores it: latents in a codec, or the
// per-head K and V an expanded cache keeps (bf16, heads x (128 + 64 + 128)
// values a token). A block holds at most kMaxLatentDim values a token and
// layer, so an expanded layer wider than that is stored as several equal
// parts, each a layer of the layout: the record's bytes are the same (with
// an indexer, each part takes an equal share of its key and a scale of its
// own, a few bytes more a token than one key).
absl::StatusOr<kvblock::LatentLayout> LayoutNamed(const std::string& name, const ModelShape& model, uint32_t layers,
                                                  uint32_t tokens_per_block) {
  if (model.v4) return V4FlashLayout(name, layers, tokens_per_block);
  kvblock::LatentLayout layout{.model_id = "trace-replay-" + model.name + "-" + name,
                               .num_layers = layers,
                               .kv_lora_rank = 512,
                               .rope_dim = 64,
                               .tokens_per_block = tokens_per_block};
  if (name == "expanded") {
    const uint32_t values = model.heads * (128 + 64 + 128);
    uint32_t parts = (values + kernels::kMaxLatentDim - 1) / kernels::kMaxLatentDim;
    while (values % parts != 0 || model.indexer_dim % parts != 0) ++parts;
    layout.num_layers = layers * parts;
    layout.kv_lora_rank = values / parts - layout.rope_dim;
    layout.codec = kernels::Codec::kBf16;
    layout.indexer_dim = model.indexer_dim / parts;
  } else if (std::optional<kernels::Codec> codec = kernels::ParseCodec(name)) {
    layout.codec = *codec;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("layout '", name, "' is not expanded, bf16, fp8, int8 or int4"));
  }
  if (model.indexer_dim > 0) {
    if (name != "expanded") layout.indexer_dim = model.indexer_dim;
    layout.indexer_encoding = kvblock::IndexerEncoding::kFp8;
    layout.block_format_version = kvblock::kIndexedBlockFormatVersion;
  }
  return layout;
}

struct Options {
  std::string cache_binary = "build/services/kvtier-cache";
  std::string trace;
  std::string evictions = "lru";
  std::string layouts = "expanded,bf16,fp8,int8,int4";
  std::string budgets = "256MiB,1GiB";
  uint64_t page_size = 16384;
  std::string model = "v2-lite";
  uint64_t layers = 0;            // 0: all of the model's
  uint64_t tokens_per_block = 0;  // 0: 64, or v4-flash's largest ratio, 128
  uint64_t restore_every = 0;
  uint64_t limit = 0;
  double time_scale = 0;
  bool write_back = false;
  bool json = false;
};

struct Row {
  std::string eviction;
  std::string layout;
  uint64_t budget;
  uint64_t block_bytes;
  ReplayResult result;
};

uint64_t TierCounter(const v1::StatsResponse& s, uint64_t (v1::TierStats::*field)() const) {
  uint64_t total = 0;
  for (const v1::TierStats& t : s.tiers()) total += (t.*field)();
  return total;
}

// One replay of `requests` on a fresh cache of `budget` bytes.
absl::StatusOr<ReplayResult> ReplayOnFreshCache(const Options& o, const std::vector<TraceRequest>& requests,
                                                const std::string& eviction, const kvblock::LatentLayout& layout,
                                                uint64_t budget) {
  ChildProcess cache({o.cache_binary, "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-memory", "host",
                      "--device-capacity", std::to_string(budget), "--host-capacity", std::to_string(o.page_size),
                      "--eviction", eviction, "--page-size", std::to_string(o.page_size)});
  const int port = cache.WaitForListeningPort();
  if (port <= 0) return absl::UnavailableError(absl::StrCat(o.cache_binary, " did not start"));
  cache::CacheClient client(MakeChannel("127.0.0.1:" + std::to_string(port)), absl::Minutes(5));
  const BlockMapping mapping{.tokens_per_block = static_cast<uint32_t>(o.tokens_per_block),
                             .layout_id = kvblock::LayoutId(layout),
                             .restore_every = static_cast<uint32_t>(o.restore_every)};
  absl::StatusOr<ReplayResult> result = Replay(requests, client, layout, mapping, o.time_scale, o.write_back);
  cache.Stop(SIGTERM);
  return result;
}

void PrintJson(const Options& o, const std::vector<Row>& rows) {
  std::cout << "[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::cout << (i ? ",\n " : "")
              << absl::StrFormat(
                     "{\"eviction\": \"%s\", \"model\": \"%s\", \"layout\": \"%s\", \"layers\": %d, "
                     "\"tokens_per_block\": %d, \"restore_every\": %d, \"budget_bytes\": %d, "
                     "\"block_bytes\": %d, \"requests\": %d, \"prompt_tokens\": %d, \"hit_tokens\": %d, "
                     "\"hit_rate\": %.4f, \"ceiling_rate\": %.4f, \"bytes_put\": %d, \"bytes_got\": %d, "
                     "\"written_back\": %d, \"demotions\": %d, \"evictions\": %d}",
                     r.eviction, o.model, r.layout, o.layers, o.tokens_per_block, o.restore_every, r.budget,
                     r.block_bytes, r.result.requests, r.result.prompt_tokens, r.result.hit_tokens, r.result.HitRate(),
                     r.result.CeilingRate(), r.result.bytes_put, r.result.bytes_got, r.result.written_back,
                     TierCounter(r.result.stats, &v1::TierStats::demotions),
                     TierCounter(r.result.stats, &v1::TierStats::evictions));
  }
  std::cout << "]\n";
}

void PrintTable(const Options& o, size_t requests, const std::vector<Row>& rows) {
  std::printf("%zu requests, %s, %d layers, blocks of %d tokens%s\n", requests, o.model.c_str(),
              static_cast<int>(o.layers), static_cast<int>(o.tokens_per_block),
              o.restore_every > 0 ? absl::StrCat(", a restore point every ", o.restore_every, " blocks").c_str() : "");
  std::printf("%-11s %-9s %10s %12s %9s %9s %12s %12s %10s\n", "eviction", "layout", "budget", "block bytes",
              "hit rate", "ceiling", "tokens saved", "evicted", "GiB put");
  for (const Row& r : rows) {
    std::printf("%-11s %-9s %10s %12llu %8.1f%% %8.1f%% %12llu %12llu %10.2f\n", r.eviction.c_str(), r.layout.c_str(),
                absl::StrFormat("%.0fMiB", r.budget / 1048576.0).c_str(),
                static_cast<unsigned long long>(r.block_bytes), 100 * r.result.HitRate(), 100 * r.result.CeilingRate(),
                static_cast<unsigned long long>(r.result.hit_tokens),
                static_cast<unsigned long long>(TierCounter(r.result.stats, &v1::TierStats::evictions)),
                r.result.bytes_put / 1073741824.0);
  }
}

int Fail(const absl::Status& status, int code) {
  std::fprintf(stderr, "trace_replay: %s\n", std::string(status.message()).c_str());
  return code;
}

int Run(Options o) {
  // Every flag's value is checked before the first replay, which may take
  // minutes.
  const ModelShape* model = nullptr;
  for (const ModelShape& m : ModelShapes()) {
    if (m.name == o.model) model = &m;
  }
  if (model == nullptr) {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat("--model ", o.model, " is not v2-lite, v3, v3.2, kimi-k2 or v4-flash")),
        2);
  }
  if (o.tokens_per_block == 0) o.tokens_per_block = model->v4 ? 128 : 64;
  if (512 % o.tokens_per_block != 0) {
    return Fail(absl::InvalidArgumentError("--tokens-per-block must divide 512 (the trace's blocks)"), 2);
  }
  if (model->v4 && o.write_back) {
    return Fail(absl::InvalidArgumentError("--write-back is not modelled for v4-flash"), 2);
  }
  if (o.layers == 0) o.layers = model->layers;
  if (o.layers > model->layers) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("--layers: ", o.model, " has ", model->layers)), 2);
  }
  std::vector<std::pair<std::string, kvblock::LatentLayout>> layouts;
  for (const std::string& name : std::vector<std::string>(absl::StrSplit(o.layouts, ',', absl::SkipEmpty()))) {
    absl::StatusOr<kvblock::LatentLayout> layout =
        LayoutNamed(name, *model, static_cast<uint32_t>(o.layers), static_cast<uint32_t>(o.tokens_per_block));
    if (!layout.ok()) return Fail(layout.status(), 2);
    layouts.emplace_back(name, *layout);
  }
  std::vector<uint64_t> budgets;
  for (absl::string_view text : absl::StrSplit(o.budgets, ',', absl::SkipEmpty())) {
    absl::StatusOr<uint64_t> budget = ParseByteSize(std::string(text));
    if (!budget.ok())
      return Fail(absl::InvalidArgumentError(absl::StrCat("--budgets: ", budget.status().message())), 2);
    budgets.push_back(*budget);
  }
  const std::vector<std::string> evictions = absl::StrSplit(o.evictions, ',', absl::SkipEmpty());
  std::ifstream in(o.trace);
  if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read ", o.trace)), 2);
  absl::StatusOr<std::vector<TraceRequest>> requests = ReadTrace(in, o.limit);
  if (!requests.ok()) return Fail(requests.status(), 2);

  std::vector<Row> rows;
  for (const std::string& eviction : evictions) {
    for (const auto& [name, layout] : layouts) {
      for (uint64_t budget : budgets) {
        absl::StatusOr<ReplayResult> result = ReplayOnFreshCache(o, *requests, eviction, layout, budget);
        if (!result.ok()) {
          return Fail(absl::Status(result.status().code(), absl::StrCat(eviction, ", ", name, ", ", budget,
                                                                        " bytes: ", result.status().message())),
                      1);
        }
        rows.push_back({eviction, name, budget, kvblock::HeaderFor(layout, 0, layout.num_layers).RecordBytes(),
                        *std::move(result)});
      }
    }
  }
  if (o.json) {
    PrintJson(o, rows);
  } else {
    PrintTable(o, requests->size(), rows);
  }
  return 0;
}

}  // namespace
}  // namespace kvtier::load

int main(int argc, char** argv) {
  kvtier::load::Options o;
  std::string time_scale = "0";
  kvtier::FlagParser flags("trace_replay --trace FILE [flags]",
                           "Replays a request trace against kvtier-cache per layout and memory budget: token-weighted "
                           "prefix hit rate against the trace's ceiling (an unbounded cache).");
  flags.AddString("cache-binary", &o.cache_binary, "the kvtier-cache to run");
  flags.AddString("trace", &o.trace, "JSON lines: timestamp, input_length, output_length, hash_ids (512-token blocks)");
  flags.AddString("evictions", &o.evictions,
                  "comma-separated kvtier-cache --eviction policies: adaptive, leaf-first, lru");
  flags.AddString("layouts", &o.layouts,
                  "comma-separated: expanded (per-head K/V, bf16), bf16, fp8, int8, int4 (v4-flash: fp8)");
  flags.AddString("budgets", &o.budgets, "comma-separated cache memory budgets, e.g. 256MiB,1GiB");
  flags.AddString("model", &o.model,
                  "whose attention to store: v2-lite (27 layers), v3, v3.2 (with indexer keys), kimi-k2 (61 layers) "
                  "or v4-flash (43 layers: compressed entries, indexer keys and restore points)");
  flags.AddUint("layers", &o.layers, "layers of the model's to store (0: all; fewer scale a run down)");
  flags.AddUint("page-size", &o.page_size,
                "the cache's --page-size: with fewer layers, a smaller page keeps a block's rounding up to whole "
                "pages near what all the model's layers see");
  flags.AddUint("tokens-per-block", &o.tokens_per_block,
                "kvtier block size; divides 512 (default 64; v4-flash: a multiple of 128, default 128)");
  flags.AddUint("restore-every", &o.restore_every,
                "v4-flash: also store a restore point after every multiple of this many blocks, as kvtier-prefill "
                "--restore-every does (0: only at each prompt's last boundary)");
  flags.AddUint("limit", &o.limit, "replay at most this many requests (0: all)");
  flags.AddString("time-scale", &time_scale, "replay at this multiple of the trace's speed (0: as fast as possible)");
  flags.AddBool("write-back", &o.write_back,
                "also store the blocks each answer fills, as decode workers write them back (they take room; the "
                "trace's later prompts never name them)");
  flags.AddBool("json", &o.json, "one JSON object per layout and budget instead of the table");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "trace_replay")) {
    return *exit;
  }
  if (o.trace.empty() || !absl::SimpleAtod(time_scale, &o.time_scale) || o.time_scale < 0) {
    std::fprintf(stderr, "trace_replay: --trace is required; --time-scale >= 0\n");
    return 2;
  }
  return kvtier::load::Run(o);
}
