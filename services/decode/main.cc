// kvtier-decode: the decode worker. Pulls sequences' latent blocks from the
// cache shards and decodes them with absorbed MLA on the quantized latents,
// batching the steps of all its sequences.
#include "absl/strings/str_cat.h"
#include "services/base/flags.h"
#include "services/decode/decode_service.h"
#include "services/server/server_runner.h"
#include "services/serving/model_server.h"

namespace kvtier::decode {
namespace {

struct Flags {
  serving::ModelServerFlags server;
  uint64_t max_batch = 32;
  uint64_t max_sequences = 256;
  uint64_t max_sequences_per_tenant = 0;
};

int Run(const Flags& f) {
  const std::string program = "kvtier-decode";
  if (f.max_batch < 1 || f.max_sequences < 1) {
    return serving::ExitWith(program, absl::InvalidArgumentError("--max-batch and --max-sequences must be positive"));
  }
  absl::StatusOr<serving::ModelServer> s = serving::StartModelServer(program, f.server);
  if (!s.ok()) return serving::ExitWith(program, s.status());
  DecodeService service(s->model.get(), s->model_id, s->shards.get(), s->registry.get(),
                        {.max_batch = f.max_batch, .max_sequences = f.max_sequences}, f.max_sequences_per_tenant);
  return serving::ServeUntilSignal(
      program, f.server, &service, v1::Decode::service_full_name(), s->tenants.get(),
      absl::StrCat("model ", s->model_id, ", ", s->shards->size(), " cache shard(s), batches of up to ", f.max_batch));
}

}  // namespace
}  // namespace kvtier::decode

int main(int argc, char** argv) {
  kvtier::BlockShutdownSignals();
  kvtier::decode::Flags f;
  kvtier::FlagParser flags("kvtier-decode --model DIR --cache ADDR[,ADDR...] [flags]",
                           "Serves kvtier.v1.Decode: continues sequences whose latent blocks live in the\n"
                           "cache shards, with absorbed MLA attention over the quantized latents, all\n"
                           "sequences' steps batched together. Blocks that fill are written back.\n"
                           "Stops gracefully on SIGTERM.");
  f.server.listen = "0.0.0.0:7072";
  f.server.Register(flags);
  flags.AddUint("max-batch", &f.max_batch, "sequences per decode step");
  flags.AddUint("max-sequences", &f.max_sequences, "sequences held at once; more get RESOURCE_EXHAUSTED");
  flags.AddUint("max-sequences-per-tenant", &f.max_sequences_per_tenant,
                "sequences one end tenant (a prefill node acting for it) may hold at once; more get "
                "RESOURCE_EXHAUSTED (0: half of --max-sequences)");
  if (std::optional<int> exit = flags.ParseOrExit(std::vector<std::string>(argv + 1, argv + argc), "kvtier-decode")) {
    return *exit;
  }
  return kvtier::decode::Run(f);
}
