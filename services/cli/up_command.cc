// `kvtier up`: the whole system on this machine, as the README's first
// command runs it. Takes the small trained model that ships with kvtier (or
// generates a random one of a preset), starts kvtier-cache, kvtier-decode and
// kvtier-prefill (the binaries next to this one) on free loopback ports, runs
// a two-turn conversation through the prefill node (the second turn reuses
// the first's blocks from the cache), prints the continuations (text where
// the model has a tokenizer, else ids), the time to first token and the
// cache's stats, then stops everything with SIGTERM.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "services/base/child_process.h"
#include "services/base/flags.h"
#include "services/cache/client/cache_client.h"
#include "services/cli/certificates.h"
#include "services/cli/commands.h"
#include "services/cli/generation_io.h"
#include "services/cli/remote_generate.h"
#include "services/cli/stats_table.h"
#include "services/rpc/client_identity.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/make_model.h"
#include "services/runtime/tokenizer.h"
#include "services/server/server_runner.h"

namespace kvtier::cli {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// The conversation's two user turns, for a model with a tokenizer.
constexpr char kFirstTurn[] =
    ":cache: /kash/, n.\n\n1. A small, fast memory that holds what the processor will want next. ";
constexpr char kSecondTurn[] = "\n\n2. [techspeak] ";

struct UpFlags {
  std::string dir = "/tmp/kvtier-up";
  std::string model;  // empty: the trained model (TrainedModel)
  std::string preset;
  std::string prompt = kFirstTurn;
  std::string kv_codec;  // empty: the prefill node's default
  uint64_t prompt_tokens = 300;
  uint64_t max_new_tokens = 80;
  // A small model's greedy text soon repeats itself; sampled, it reads.
  runtime::Sampling sampling{.temperature = 0.7f, .top_p = 0.9f, .seed = 1};
  uint64_t seed = 1;
  bool keep = false;
  std::string device = "cpu";
  bool tls = false;
  std::string tls_keep;  // keep the CA and certificates here (implies tls)
};

class Progress {
 public:
  void Step(const std::string& what) { std::cerr << absl::StrFormat("[%5.1fs] %s\n", Seconds(), what) << std::flush; }
  double Seconds() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  Clock::time_point start_ = Clock::now();
};

// Waits for a server's "listening on" line, printing a dot a second so a
// long model load shows progress. Empty when the child died or 10 minutes
// passed.
std::optional<std::string> WaitUntilServing(ChildProcess& child, const std::string& name) {
  for (int second = 0; second < 600; ++second) {
    if (std::optional<std::string> address = child.WaitForLine("listening on ", 1000)) {
      if (second > 0) std::cerr << "\n";
      return address;
    }
    if (child.output_closed()) break;
    std::cerr << (second == 0 ? "        waiting for " + name + " " : ".") << std::flush;
  }
  std::cerr << "\n";
  return std::nullopt;
}

std::string SelfDir() {
  std::error_code error;
  const fs::path self = fs::read_symlink("/proc/self/exe", error);
  return error ? "." : self.parent_path().string();
}

// The trained model (models/train_jargon.py): where `cmake --install` and
// the image put it beside the binaries in `bin`, else in the source tree
// this binary was built from.
std::string TrainedModel(const std::string& bin) {
  const fs::path installed = (fs::path(bin) / KVTIER_INSTALLED_MODELS_DIR / "jargon-mla").lexically_normal();
  if (fs::exists(installed / "config.json")) return installed.string();
  return KVTIER_MODELS_DIR "/jargon-mla";
}

// Sampled with a seed (the same text every run) where the model has a
// tokenizer; greedy on random ids.
v1::GenerateRequest Request(const std::vector<uint32_t>& prompt, const UpFlags& f, const std::string& id, bool text) {
  v1::GenerateRequest r;
  r.set_request_id(id);
  if (text) {
    r.mutable_sampling()->set_temperature(f.sampling.temperature);
    r.mutable_sampling()->set_top_p(f.sampling.top_p);
    r.mutable_sampling()->set_seed(f.sampling.seed);
  }
  for (uint32_t t : prompt) r.add_prompt_token_ids(t);
  r.mutable_limits()->set_max_new_tokens(static_cast<uint32_t>(f.max_new_tokens));
  r.mutable_limits()->set_top_logprobs(5);
  if (text) r.mutable_limits()->add_stop_token_ids(runtime::ByteTokenizer::kEos);
  return r;
}

int Up(const UpFlags& f) {
  Progress progress;
  auto fail = [](const std::string& message) {
    std::cerr << "kvtier up: " << message << "\n";
    return 1;
  };
  const std::string bin = SelfDir();
  for (const char* name : {"kvtier-cache", "kvtier-decode", "kvtier-prefill"}) {
    if (access((bin + "/" + name).c_str(), X_OK) != 0) {
      return fail(absl::StrCat(bin, "/", name, " is missing: build everything first (cmake --build build)"));
    }
  }
  if (!f.kv_codec.empty() && !kernels::ParseCodec(f.kv_codec)) {
    return fail("--kv-codec must be one of bf16, fp8, int8, int4");
  }
  std::string model_dir = f.model.empty() ? TrainedModel(bin) : f.model;
  if (!f.preset.empty()) {
    absl::StatusOr<runtime::ModelConfig> config = runtime::PresetConfig(f.preset);
    if (!config.ok()) return fail(std::string(config.status().message()));
    model_dir = absl::StrCat(f.dir, "/model-", f.preset, "-seed", f.seed);
    if (!fs::exists(model_dir + "/config.json")) {
      progress.Step(absl::StrCat("generating the random ", f.preset, " model in ", model_dir));
      if (absl::Status s = runtime::MakeModel(*config, model_dir, f.seed, runtime::PublishedShards(*config)); !s.ok()) {
        return fail(std::string(s.message()));
      }
    }
  }
  absl::StatusOr<std::unique_ptr<runtime::Checkpoint>> checkpoint = runtime::Checkpoint::Open(model_dir);
  if (!checkpoint.ok()) return fail(std::string(checkpoint.status().message()));
  const runtime::ModelConfig config = (*checkpoint)->config();
  // The prefill node's blocks: its default, or for DeepSeek-V4 a multiple
  // of every compress ratio.
  std::vector<std::string> prefill_flags;
  if (!f.kv_codec.empty()) prefill_flags = {"--kv-codec", f.kv_codec};
  if (config.v4.has_value() && config.v4->max_ratio() > 64) {
    prefill_flags.insert(prefill_flags.end(), {"--tokens-per-block", std::to_string(config.v4->max_ratio())});
  }
  // With a tokenizer the turns are text; without, random ids.
  std::optional<runtime::ByteTokenizer> tokenizer;
  if (!(*checkpoint)->tokenizer_class().empty()) {
    absl::StatusOr<runtime::ByteTokenizer> t =
        runtime::ByteTokenizer::ForClass((*checkpoint)->tokenizer_class(), config.vocab_size);
    if (!t.ok()) return fail(std::string(t.status().message()));
    tokenizer = *t;
  }
  checkpoint->reset();
  std::mt19937_64 rng(f.seed);
  std::uniform_int_distribution<uint32_t> id(0, static_cast<uint32_t>(config.vocab_size - 1));
  const auto user_turn = [&](const std::string& text, size_t random_ids) {
    if (tokenizer) return tokenizer->Encode(text);
    std::vector<uint32_t> ids(random_ids);
    for (uint32_t& t : ids) t = id(rng);
    return ids;
  };
  std::vector<uint32_t> prompt = user_turn(f.prompt, f.prompt_tokens);
  const std::vector<uint32_t> second_turn = user_turn(kSecondTurn, 16);
  if (prompt.empty() || f.max_new_tokens < 1 ||
      prompt.size() + second_turn.size() + f.max_new_tokens * 2 >
          static_cast<uint64_t>(config.max_position_embeddings)) {
    return fail(absl::StrCat("the prompt and --max-new-tokens must not be empty, and two turns must fit the model's ",
                             config.max_position_embeddings, " positions"));
  }
  progress.Step(absl::StrCat(f.preset.empty() ? "the model in " : "the random model in ", model_dir,
                             tokenizer ? " (text through its byte tokenizer)" : " (no tokenizer: random ids)"));

  // With --tls every call is over TLS, the cache and the decode worker
  // take only callers with a certificate from the CA made here.
  std::vector<std::string> tls, mtls;
  const bool keep_tls = !f.tls_keep.empty();
  const std::string certificates = keep_tls ? f.tls_keep : f.tls ? absl::StrCat(f.dir, "/tls-", getpid()) : "";
  const std::string tls_dir = certificates.empty() ? "" : certificates + "/server";
  // A throwaway CA goes with this process (its key is already deleted).
  const std::string throwaway = keep_tls ? "" : certificates;
  const std::unique_ptr<const std::string, void (*)(const std::string*)> remove_tls(&throwaway,
                                                                                    [](const std::string* d) {
                                                                                      std::error_code ignored;
                                                                                      if (!d->empty())
                                                                                        fs::remove_all(*d, ignored);
                                                                                    });
  if (!tls_dir.empty()) {
    if (absl::Status s = MakeCertificates({.dir = certificates,
                                           .server_names = {"localhost", "127.0.0.1"},
                                           .clients = {},
                                           .days = keep_tls ? 365 : 1,
                                           .keep_ca_key = keep_tls});
        !s.ok()) {
      return fail(std::string(s.message()));
    }
    if (absl::Status s = SetClientIdentity({.tls = {.dir = tls_dir}, .token_file = ""}); !s.ok()) {
      return fail(std::string(s.message()));
    }
    tls = {"--tls-dir", tls_dir};
    mtls = {"--tls-dir", tls_dir, "--tls-require-client-cert"};
    progress.Step(keep_tls
                      ? absl::StrCat("a CA kept in ", certificates, " (its key: ca.key); every call over TLS with ",
                                     tls_dir, " (give it to --tls-dir to call these servers)")
                      : absl::StrCat("a throwaway CA and certificate in ", tls_dir, "; every call over TLS"));
  }
  const auto with = [](std::vector<std::string> argv, const std::vector<std::string>& extra) {
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  };
  // A server's command line. No load balancer or probe watches these, and
  // every call has ended before each is stopped: nothing to drain (by
  // default a server answers NOT_SERVING for a second before it closes).
  const auto server = [&with](std::vector<std::string> argv, const std::vector<std::string>& extra) {
    return with(with(std::move(argv), extra), {"--drain-ms", "0"});
  };
  ChildProcess cache(server({bin + "/kvtier-cache", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                             "--device-capacity", "256MiB", "--host-capacity", "1GiB"},
                            mtls));
  const std::optional<std::string> metrics = cache.WaitForLine("metrics on ", 30000);
  const std::optional<std::string> cache_address = WaitUntilServing(cache, "kvtier-cache");
  if (!cache_address) return fail("kvtier-cache did not start (its error is above)");
  progress.Step(absl::StrCat("kvtier-cache serving on ", *cache_address, ", metrics on ", metrics.value_or("?")));

  ChildProcess decode(server({bin + "/kvtier-decode", "--listen", "127.0.0.1:0", "--model", model_dir, "--cache",
                              *cache_address, "--device", f.device},
                             mtls));
  const std::optional<std::string> decode_address = WaitUntilServing(decode, "kvtier-decode to load the model");
  if (!decode_address) return fail("kvtier-decode did not start (its error is above)");
  progress.Step(absl::StrCat("kvtier-decode serving on ", *decode_address));
  ChildProcess prefill(server({bin + "/kvtier-prefill", "--listen", "127.0.0.1:0", "--model", model_dir, "--cache",
                               *cache_address, "--decode", *decode_address, "--device", f.device},
                              with(tls, prefill_flags)));
  const std::optional<std::string> prefill_address = WaitUntilServing(prefill, "kvtier-prefill to load the model");
  if (!prefill_address) return fail("kvtier-prefill did not start (its error is above)");
  progress.Step(absl::StrCat("kvtier-prefill serving on ", *prefill_address));

  // Turn 1: a fresh prompt (a full miss). Turn 2: the conversation so far
  // plus a new question: its prefix is in the cache.
  std::vector<uint32_t> turn_text = prompt;
  for (int turn = 1; turn <= 2; ++turn) {
    progress.Step(absl::StrCat("turn ", turn, ": generating up to ", f.max_new_tokens, " tokens after a ",
                               prompt.size(), "-token prompt"));
    absl::StatusOr<RemoteGeneration> out = GenerateRemotely(
        *prefill_address, Request(prompt, f, absl::StrCat("up-turn-", turn), tokenizer.has_value()), absl::Minutes(10));
    if (!out.ok()) return fail(absl::StrCat("turn ", turn, ": ", out.status().ToString()));
    std::cout << absl::StrFormat("turn %d: %u prompt tokens, %u from the cache, first token after %.1f ms\n", turn,
                                 out->usage.prompt_tokens(), out->usage.cached_tokens(),
                                 out->usage.time_to_first_token_us() / 1e3);
    std::vector<uint32_t> generated;
    for (const runtime::Sampled& s : out->tokens) generated.push_back(s.token);
    if (tokenizer) {
      // The user's words, then the model's in [brackets], each line indented.
      std::cout << "  | "
                << absl::StrReplaceAll(
                       absl::StrCat(tokenizer->Decode(turn_text), "[", tokenizer->Decode(generated), "]"),
                       {{"\n", "\n  | "}})
                << "\n";
    } else {
      std::cout << "  ids: " << IdsLine(out->tokens) << "\n";
    }
    prompt.insert(prompt.end(), generated.begin(), generated.end());
    prompt.insert(prompt.end(), second_turn.begin(), second_turn.end());  // the user's next question
    turn_text = second_turn;
  }
  absl::StatusOr<v1::StatsResponse> stats = cache::CacheClient(MakeChannel(*cache_address), absl::Seconds(5)).Stats();
  if (!stats.ok()) return fail(absl::StrCat("cache stats: ", stats.status().ToString()));
  std::cout << "\n" << StatsTable(*cache_address, *stats) << std::flush;

  if (f.keep) {
    std::cerr << "\nserving until Ctrl-C: kvtier generate --target " << *prefill_address
              << " --prompt-ids 1,2,3 --max-new-tokens 8\n";
    WaitForStopSignal();
  }
  // The front door first, the cache last: nothing is in flight by then.
  for (auto [child, name] :
       {std::pair{&prefill, "kvtier-prefill"}, {&decode, "kvtier-decode"}, {&cache, "kvtier-cache"}}) {
    progress.Step(absl::StrCat("stopping ", name, " (SIGTERM)"));
    if (const int code = child->Stop(SIGTERM); code != 0) return fail(absl::StrCat(name, " exited with ", code));
  }
  progress.Step("all three stopped cleanly");
  return 0;
}

}  // namespace

int RunUp(const std::vector<std::string>& args) {
  BlockShutdownSignals();  // Ctrl-C during --keep is ours to handle
  UpFlags f;
  FlagParser flags("kvtier up [flags]",
                   "Starts kvtier-cache, kvtier-decode and kvtier-prefill locally on kvtier's small\n"
                   "trained model (or --model, or a random --preset model), runs a two-turn\n"
                   "conversation through the prefill node (the second turn hits the first's blocks\n"
                   "in the cache), prints what the model wrote (in [brackets] after the user's\n"
                   "text), the time to first token and the cache's stats, then stops them all.");
  flags.AddString("dir", &f.dir, "where a --preset model and --tls files go (a model is reused when present)");
  flags.AddString("model", &f.model,
                  "checkpoint directory (default: the trained model, in PREFIX/share/kvtier when installed, "
                  "else in the source tree's models/)");
  flags.AddString("preset", &f.preset,
                  "instead of --model, a generated random model: tiny, lite-attn, v3-tiny, kimi-k2-tiny, v32-tiny, "
                  "v4-tiny or v4-tiny-fp8");
  flags.AddString("prompt", &f.prompt, "the first turn's text (a model with a tokenizer)");
  flags.AddString("kv-codec", &f.kv_codec,
                  "bf16|fp8|int8|int4: how latent blocks are stored (default: the prefill node's, int8; a "
                  "DeepSeek-V4 model's entries are its own FP8)");
  flags.AddUint("prompt-tokens", &f.prompt_tokens, "length of the first turn's random prompt (no tokenizer)");
  flags.AddUint("max-new-tokens", &f.max_new_tokens, "most tokens generated per turn (a turn ends at end of text)");
  flags.AddUint("seed", &f.seed, "a --preset model's seed and its prompts', and the text turns' sampling seed");
  std::string temperature = "0.7", top_p = "0.9";
  flags.AddString("temperature", &temperature, "sampling temperature of a text model's turns (0: greedy)");
  flags.AddString("top-p", &top_p, "nucleus sampling mass of a text model's turns");
  flags.AddBool("keep", &f.keep, "keep serving after the conversation until Ctrl-C");
  flags.AddString("device", &f.device, "cpu|cuda: where kvtier-decode and kvtier-prefill run the model");
  flags.AddBool("tls", &f.tls,
                "run every call over TLS, with a throwaway CA made under --dir (mutual TLS to the cache and the "
                "decode worker)");
  flags.AddString("tls-keep", &f.tls_keep,
                  "--tls, with the CA and certificates made in this directory and kept (as kvtier make-certs lays "
                  "them out: DIR/server is the --tls-dir to call the servers with)");
  if (std::optional<int> exit = flags.ParseOrExit(args, "kvtier up")) return *exit;
  SamplingFlags sampling{temperature, top_p, f.seed};
  absl::StatusOr<runtime::Sampling> parsed = sampling.Parse();
  if (!parsed.ok()) {
    std::cerr << "kvtier up: " << parsed.status().message() << "\n";
    return 2;
  }
  f.sampling = *parsed;
  return Up(f);
}

}  // namespace kvtier::cli
