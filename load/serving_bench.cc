// The services end to end on the lite-attn preset (DeepSeek-V2-Lite's
// attention dims): kvtier-cache, kvtier-decode and kvtier-prefill started
// on free loopback ports.
//
// 1. Time to first token for a 2,048-token prompt: a full miss (a fresh
//    prompt) against a full prefix hit (the same prompt again: 31 of its 32
//    blocks come from the cache; the last block holds the token whose logits
//    must be computed).
// 2. Decode tokens/s with 1, 8 and 32 concurrent sequences through the
//    services, next to the same batch sizes stepped in process
//    (Model::Forward): the ratio is what the services cost.
//
//   serving_bench [--rounds N] [--bin-dir build/services]
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <random>
#include <thread>

#include "kvtier/kernels/parallel.h"
#include "kvtier/v1/prefill.grpc.pb.h"
#include "load/decode_steps.h"
#include "load/median.h"
#include "load/serve_target.h"
#include "services/base/child_process.h"
#include "services/base/flags.h"
#include "services/base/metrics_page.h"
#include "services/cache/client/cache_client.h"
#include "services/rpc/client_identity.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/model.h"

namespace kvtier {
namespace {

using load::Median;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Short prompts in the decode rows, so that their prefills barely overlap
// the decoding being measured.
constexpr size_t kDecodePrompt = 16;

std::vector<uint32_t> RandomPrompt(size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<uint32_t> id(0, 1023);
  std::vector<uint32_t> p(n);
  for (auto& t : p) t = id(rng);
  return p;
}

// One generation's timings, as the client sees them.
struct Timed {
  double ttft_ms = 0;         // request sent -> token 0
  double server_ttft_ms = 0;  // the prefill node's own figure (usage)
  uint32_t cached = 0;
  uint32_t tokens = 0;
  Clock::time_point first_decode, last;  // token 1 and the last token
};

Timed Generate(v1::Prefill::Stub& stub, const std::vector<uint32_t>& prompt, uint32_t max_new) {
  v1::GenerateRequest r;
  for (uint32_t t : prompt) r.add_prompt_token_ids(t);
  r.mutable_limits()->set_max_new_tokens(max_new);
  grpc::ClientContext context;
  const auto start = Clock::now();
  auto reader = stub.Generate(&context, r);
  Timed t;
  v1::GenerateResponse e;
  while (reader->Read(&e)) {
    const auto now = Clock::now();
    if (e.has_token()) {
      if (e.token().index() == 0) t.ttft_ms = std::chrono::duration<double, std::milli>(now - start).count();
      if (e.token().index() == 1) t.first_decode = now;
      t.last = now;
      ++t.tokens;
    } else if (e.has_finished()) {
      t.cached = e.finished().usage().cached_tokens();
      t.server_ttft_ms = e.finished().usage().time_to_first_token_us() / 1e3;
    }
  }
  if (grpc::Status s = reader->Finish(); !s.ok()) {
    std::fprintf(stderr, "Generate failed: %s\n", s.error_message().c_str());
    std::exit(1);
  }
  return t;
}

// The decode worker's step count and the sequences its steps carried, from
// its batch-size histogram (zeros if it cannot be scraped).
std::pair<double, double> DecodeSteps(const std::string& metrics) {
  const std::string page = ScrapeMetrics(metrics);
  return {MetricValue(page, "kvtier_decode_batch_size_count").value_or(0),
          MetricValue(page, "kvtier_decode_batch_size_sum").value_or(0)};
}

// Decode tokens/s of `batch` sequences stepped together in process, after
// prompts of `prompt` tokens.
double InProcessDecode(const runtime::Model& model, size_t batch, size_t prompt, int steps, std::mt19937_64& rng) {
  std::vector<runtime::SequenceCache> caches;
  std::vector<std::vector<float>> logits(batch, std::vector<float>(model.config().vocab_size));
  for (size_t b = 0; b < batch; ++b) {
    caches.push_back(model.NewCache(kernels::Codec::kInt8, 64));
    (void)model.Prefill(RandomPrompt(prompt, rng), caches.back(), logits[b]);
  }
  const absl::StatusOr<double> seconds = load::TimeDecodeSteps(model, caches, static_cast<uint64_t>(steps), 1);
  if (!seconds.ok()) {
    std::fprintf(stderr, "in-process decode failed: %s\n", std::string(seconds.status().message()).c_str());
    std::exit(1);
  }
  return static_cast<double>(batch * steps) / *seconds;
}

int Main(int argc, char** argv) {
  std::string bin = "build/services";
  uint64_t rounds = 3, prompt_tokens = 2048, decode_tokens = 48;
  FlagParser flags("serving_bench [--rounds N] [--bin-dir DIR]",
                   "Time to first token (prefix hit vs miss) and decode tokens/s through the services.");
  flags.AddString("bin-dir", &bin, "directory of kvtier-cache, kvtier-decode, kvtier-prefill");
  flags.AddUint("rounds", &rounds, "measurements per row (the median is shown)");
  flags.AddUint("prompt-tokens", &prompt_tokens, "prompt length for the time-to-first-token rows");
  flags.AddUint("decode-tokens", &decode_tokens, "tokens each sequence generates in the decode rows");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "serving_bench")) {
    return *exit;
  }
  rounds = std::max<uint64_t>(rounds, 1);
  const fs::path model_dir = fs::temp_directory_path() / ("kvtier_serving_bench_" + std::to_string(getpid()));
  if (absl::Status s = runtime::MakeModel(*runtime::PresetConfig("lite-attn"), model_dir.string(), 3); !s.ok()) {
    std::fprintf(stderr, "make-model: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  ChildProcess cache({bin + "/kvtier-cache", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-capacity",
                      "2GiB", "--host-capacity", "1GiB"});
  const std::string cache_target = load::ServeTarget(cache, "kvtier-cache");
  ChildProcess decode({bin + "/kvtier-decode", "--listen", "127.0.0.1:0", "--model", model_dir.string(), "--cache",
                       cache_target, "--metrics-listen", "127.0.0.1:0"});
  const std::optional<std::string> metrics_line = decode.WaitForLine("metrics on ");
  const std::string decode_metrics = metrics_line ? metrics_line->substr(0, metrics_line->find('/')) : "";
  const std::string decode_target = load::ServeTarget(decode, "kvtier-decode");
  ChildProcess prefill({bin + "/kvtier-prefill", "--listen", "127.0.0.1:0", "--model", model_dir.string(), "--cache",
                        cache_target, "--decode", decode_target, "--kv-codec", "int8"});
  const std::string prefill_target = load::ServeTarget(prefill, "kvtier-prefill");
  auto stub = v1::Prefill::NewStub(MakeChannel(prefill_target));
  // A second prefill node on the same cache and decode worker, reading the
  // cached prefix over TCP: the full-hit rows compare the two.
  ChildProcess tcp_prefill({bin + "/kvtier-prefill", "--listen", "127.0.0.1:0", "--model", model_dir.string(),
                            "--cache", cache_target, "--decode", decode_target, "--kv-codec", "int8",
                            "--no-fast-path"});
  auto tcp_stub = v1::Prefill::NewStub(MakeChannel(load::ServeTarget(tcp_prefill, "kvtier-prefill")));
  std::mt19937_64 rng(9);

  std::vector<double> miss, hit, tcp_hit, miss_server, hit_server, tcp_hit_server;
  uint32_t cached = 0;
  for (uint64_t r = 0; r < rounds; ++r) {
    const std::vector<uint32_t> prompt = RandomPrompt(prompt_tokens, rng);
    const Timed cold = Generate(*stub, prompt, 1);
    // Alternate which goes first, so neither always finds the CPU caches warm.
    Timed warm, tcp_warm;
    if (r % 2 == 0) {
      warm = Generate(*stub, prompt, 1), tcp_warm = Generate(*tcp_stub, prompt, 1);
    } else {
      tcp_warm = Generate(*tcp_stub, prompt, 1), warm = Generate(*stub, prompt, 1);
    }
    miss.push_back(cold.ttft_ms), miss_server.push_back(cold.server_ttft_ms);
    hit.push_back(warm.ttft_ms), hit_server.push_back(warm.server_ttft_ms);
    tcp_hit.push_back(tcp_warm.ttft_ms), tcp_hit_server.push_back(tcp_warm.server_ttft_ms);
    cached = warm.cached;
  }
  std::printf("time to first token, %zu-token prompt, int8 latents (median of %zu)\n", prompt_tokens, rounds);
  std::printf("%-40s %12s %14s\n", "", "client ms", "prefill node ms");
  std::printf("%-40s %12.1f %14.1f\n", "full miss", Median(miss), Median(miss_server));
  std::printf("%-40s %12.1f %14.1f\n", ("full hit (" + std::to_string(cached) + " cached), fast path").c_str(),
              Median(hit), Median(hit_server));
  std::printf("%-40s %12.1f %14.1f\n", ("full hit (" + std::to_string(cached) + " cached), --no-fast-path").c_str(),
              Median(tcp_hit), Median(tcp_hit_server));
  std::printf("hit / miss: %.3f (target <= 0.1); fast path / TCP hit: %.3f (target < 1)\n\n",
              Median(hit) / Median(miss), Median(hit) / Median(tcp_hit));

  // In process with as many kernel threads as the servers use by default.
  kernels::SetKernelThreads(std::max(1u, std::thread::hardware_concurrency()));
  auto checkpoint = runtime::Checkpoint::Open(model_dir.string());
  auto model = runtime::Model::Load(**checkpoint);
  std::printf("decode, %zu tokens per sequence after a %zu-token prompt (median of %zu)\n", decode_tokens,
              kDecodePrompt, rounds);
  // "mean batch": sequences per step of the decode worker during the
  // services' rows (sequences arrive one prefill at a time, so the first and
  // last steps of a row carry fewer than all of them).
  std::printf("%-10s %16s %18s %8s %11s\n", "sequences", "services tok/s", "in process tok/s", "ratio", "mean batch");
  for (size_t batch : {1, 8, 32}) {
    std::vector<double> served, local;
    const auto [steps_before, carried_before] = DecodeSteps(decode_metrics);
    for (uint64_t r = 0; r < rounds; ++r) {
      std::vector<std::vector<uint32_t>> prompts;
      for (size_t b = 0; b < batch; ++b) prompts.push_back(RandomPrompt(kDecodePrompt, rng));
      std::vector<std::future<Timed>> runs;
      for (const auto& p : prompts) {
        runs.push_back(std::async(std::launch::async,
                                  [&, p] { return Generate(*stub, p, static_cast<uint32_t>(decode_tokens)); }));
      }
      std::vector<Timed> done;
      for (auto& f : runs) done.push_back(f.get());
      // Tokens after index 0 (those the decode worker made) over the span
      // from the first sequence's token 1 to the last sequence's end.
      Clock::time_point from = done[0].first_decode, to = done[0].last;
      size_t tokens = 0;
      for (const Timed& t : done)
        from = std::min(from, t.first_decode), to = std::max(to, t.last), tokens += t.tokens - 1;
      served.push_back(static_cast<double>(tokens) / std::chrono::duration<double>(to - from).count());
      local.push_back(InProcessDecode(**model, batch, kDecodePrompt, static_cast<int>(decode_tokens), rng));
    }
    const auto [steps_after, carried_after] = DecodeSteps(decode_metrics);
    const double steps = steps_after - steps_before;
    std::printf("%-10zu %16.1f %18.1f %8.2f %11.1f\n", batch, Median(served), Median(local),
                Median(served) / Median(local), steps > 0 ? (carried_after - carried_before) / steps : 0.0);
  }
  fs::remove_all(model_dir);
  return 0;
}

}  // namespace
}  // namespace kvtier

int main(int argc, char** argv) { return kvtier::Main(argc, argv); }
