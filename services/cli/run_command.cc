// `kvtier run`: in-process generation on a checkpoint, no servers (for
// checking a model). Last stdout line: the generated ids; or, with --json,
// one JSON object with ids, logprobs and top logprobs.
#include <algorithm>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/parallel.h"
#include "services/base/flags.h"
#include "services/base/status.h"
#include "services/base/usable_cpus.h"
#include "services/cli/commands.h"
#include "services/cli/generation_io.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/generate.h"

namespace kvtier::cli {
namespace {

// `rows` ([layer] rows of `dim` floats, as many in each layer) as a NumPy
// .npy file of float32 [layers][tokens][dim].
absl::Status WriteNpy(const std::string& path, const std::vector<std::vector<float>>& rows, size_t dim) {
  const size_t tokens = rows.empty() ? 0 : rows[0].size() / dim;
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", rows.size(), ", ", tokens, ", ", dim, "), }");
  // Magic, version 1.0, a little-endian u16 length; data 64-byte aligned.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint16_t length = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&length), 2);
  out << header;
  for (const std::vector<float>& layer : rows) {
    out.write(reinterpret_cast<const char*>(layer.data()), static_cast<std::streamsize>(layer.size() * sizeof(float)));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("--latents-out: cannot write ", path));
  return absl::OkStatus();
}

absl::Status Run(const std::string& model_dir, const PromptFlags& prompt_flags, uint64_t max_new,
                 const std::string& codec_name, uint64_t tokens_per_block, bool json, const runtime::Sampling& sampling,
                 const std::string& device_name, const std::string& latents_out, uint64_t cached_prefix) {
  if (model_dir.empty()) return absl::InvalidArgumentError("--model is required");
  const absl::StatusOr<runtime::Device> device = runtime::ParseDevice(device_name);
  if (!device.ok()) return device.status();
  const std::optional<kernels::Codec> codec = kernels::ParseCodec(codec_name);
  if (!codec)
    return absl::InvalidArgumentError(absl::StrCat("--kv-codec ", codec_name, " is not one of bf16, fp8, int8, int4"));
  if (max_new < 1 || max_new > 1 << 20) return absl::InvalidArgumentError("--max-new-tokens must be in 1..1048576");
  if (tokens_per_block < 1 || tokens_per_block > kernels::kMaxBlockTokens) {
    return absl::InvalidArgumentError("--tokens-per-block must be in 1..4096");
  }
  KVTIER_RETURN_IF_ERROR(prompt_flags.Check());
  auto ckpt = runtime::Checkpoint::Open(model_dir);
  if (!ckpt.ok()) return ckpt.status();
  if ((*ckpt)->config().v4.has_value() && !latents_out.empty()) {
    return absl::InvalidArgumentError(
        "--latents-out: a DeepSeek-V4 model keeps window and compressed entries, not MLA latents");
  }
  auto prompt = prompt_flags.Ids((*ckpt)->tokenizer_class(), (*ckpt)->config().vocab_size);
  if (!prompt.ok()) return prompt.status();
  auto model = runtime::Model::Load(**ckpt, *device);
  if (!model.ok()) return model.status();
  runtime::GenerateOptions options;
  options.max_new_tokens = static_cast<uint32_t>(max_new);
  options.codec = *codec;
  options.tokens_per_block = static_cast<uint32_t>(tokens_per_block);
  options.sampling = sampling;
  options.cached_prefix = static_cast<uint32_t>(std::min<uint64_t>(cached_prefix, UINT32_MAX));
  std::vector<std::vector<float>> sealed;
  if (!latents_out.empty()) options.sealed_latents = &sealed;
  auto out = runtime::Generate(**model, *prompt, options);
  if (!out.ok()) return out.status();
  if (!latents_out.empty()) {
    const runtime::ModelConfig& c = (*model)->config();
    KVTIER_RETURN_IF_ERROR(WriteNpy(latents_out, sealed, static_cast<size_t>(c.kv_lora_rank + c.qk_rope_head_dim)));
  }
  std::cout << GenerationOutput(*out, prompt->size(), options.cached_prefix, prompt_flags, json) << "\n";
  return absl::OkStatus();
}

}  // namespace

int RunRun(const std::vector<std::string>& args) {
  std::string model, codec = "bf16", device = "cpu", latents_out;
  PromptFlags prompt;
  uint64_t max_new = 16, tokens_per_block = 64, threads = UsableCpus(), cached_prefix = 0;
  SamplingFlags sampling_flags;
  bool json = false;
  FlagParser flags("kvtier run --model DIR (--prompt-ids 1,2,3 | --prompt TEXT) --max-new-tokens N [flags]",
                   "Generates in process (no servers) on a DeepSeek-V2, V3-family or V4 checkpoint:\n"
                   "MLA models attend (absorbed) over latents stored in --kv-codec; V4 keeps its\n"
                   "window and compressed entries in its own FP8 rounding (--kv-codec and\n"
                   "--tokens-per-block do not apply). Greedy unless --temperature is given.");
  flags.AddString("model", &model, "checkpoint directory (config.json + safetensors)");
  prompt.Register(flags);
  flags.AddUint("max-new-tokens", &max_new, "tokens to generate");
  flags.AddString("kv-codec", &codec, "bf16|fp8|int8|int4: how full latent blocks are stored");
  flags.AddUint("tokens-per-block", &tokens_per_block, "tokens per latent block");
  flags.AddBool("json", &json, "print {ids, logprobs, top_logprobs, prompt_tokens, cached_tokens}");
  flags.AddUint("threads", &threads, "threads for the model's matrix products");
  flags.AddString("device", &device, runtime::kDeviceFlagHelp);
  flags.AddString("latents-out", &latents_out,
                  "write the float latents of every block sealed (the prompt's full blocks first) to this .npy "
                  "file, float32 [layers][tokens][kv_lora_rank + rope]: to check another codec implementation");
  flags.AddUint("cached-prefix-tokens", &cached_prefix,
                "prefill these first prompt tokens (whole blocks) on their own and seal their blocks in --kv-codec "
                "before the rest, which then attends to their codes: what a served turn whose prefix came from the "
                "cache computes (0: one prefill)");
  sampling_flags.Register(flags);
  if (std::optional<int> exit = flags.ParseOrExit(args, "kvtier run")) return *exit;
  kernels::SetKernelThreads(std::clamp<uint64_t>(threads, 1, 1024));
  absl::StatusOr<runtime::Sampling> sampling = sampling_flags.Parse();
  absl::Status s = sampling.status();
  if (s.ok()) {
    s = Run(model, prompt, max_new, codec, tokens_per_block, json, *sampling, device, latents_out, cached_prefix);
  }
  if (!s.ok()) {
    std::cerr << "kvtier run: " << s.message() << "\n";
    return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace kvtier::cli
