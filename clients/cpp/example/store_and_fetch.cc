// A program outside kvtier's tree using the installed C++ client: it stores
// the int8 latent blocks of a 128-token prompt in a kvtier-cache, asks how
// much of the prompt is cached, reads the blocks back and checks them.
//   store_and_fetch HOST:PORT [TLS_DIR [TOKEN_FILE]]
// Exit 0 when every block came back byte for byte.
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "services/cache/client/shard_set.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/block_key.h"
#include "services/rpc/client_identity.h"

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "store_and_fetch: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) return Fail("usage: store_and_fetch HOST:PORT [TLS_DIR [TOKEN_FILE]]");
  // Every channel made from here on: TLS with the CA (and a client
  // certificate) in TLS_DIR, and a bearer token, when given.
  const kvtier::ClientIdentityOptions identity{.tls = {.dir = argc > 2 ? argv[2] : ""},
                                               .token_file = argc > 3 ? argv[3] : ""};
  if (absl::Status s = kvtier::SetClientIdentity(identity); !s.ok()) return Fail(s.ToString());

  // What a block's bytes depend on: the model's latent dims and layers,
  // tokens per block and the codec. Its id is part of every block's key.
  kvtier::kvblock::LatentLayout layout;
  layout.model_id = "store-and-fetch-example";
  layout.num_layers = 2;
  layout.kv_lora_rank = 512;
  layout.rope_dim = 64;
  layout.tokens_per_block = 64;
  layout.codec = kvtier::kernels::Codec::kInt8;
  if (absl::Status s = kvtier::kvblock::ValidateLayout(layout); !s.ok()) return Fail(s.ToString());
  const std::string ns = "example";  // the tenant namespace: the salt of the keys

  // The prompt's full blocks are keyed by a hash chain over its tokens.
  std::vector<uint32_t> tokens(128);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 1000 + i;
  const std::vector<kvtier::kvblock::BlockHash> chain =
      kvtier::kvblock::ComputeBlockChain(ns, kvtier::kvblock::LayoutId(layout), layout.tokens_per_block, tokens);

  // Each block: every layer's latents [tokens][kv_lora_rank + rope_dim],
  // quantized and framed as one record (what a model's prefill computes;
  // random values here).
  std::mt19937 rng{std::random_device{}()};
  std::normal_distribution<float> value(0.0f, 1.0f);
  const size_t values = size_t{layout.num_layers} * layout.tokens_per_block * (layout.kv_lora_rank + layout.rope_dim);
  std::vector<kvtier::cache::BlockSlices> blocks;
  for (const kvtier::kvblock::BlockHash& hash : chain) {
    std::vector<float> latents(values);
    for (float& v : latents) v = value(rng);
    absl::StatusOr<std::string> record = kvtier::kvblock::EncodeBlock(layout, 0, layout.num_layers, latents);
    if (!record.ok()) return Fail(record.status().ToString());
    blocks.push_back({hash, {std::move(*record)}});
  }

  // One shard here; a comma-separated list spreads blocks over several.
  absl::StatusOr<std::unique_ptr<kvtier::cache::ShardSet>> shards =
      kvtier::cache::ShardSet::Create(argv[1], absl::Seconds(10));
  if (!shards.ok()) return Fail(shards.status().ToString());
  // A shard that is down only makes its blocks misses; ask first, to say so.
  (*shards)->CheckHealth();
  for (const auto& [shard, health] : (*shards)->HealthOfShards()) {
    if (health != kvtier::cache::ShardSet::Health::kUp) return Fail("shard " + shard + " is not serving");
  }
  const std::set<kvtier::kvblock::BlockHash> stored = (*shards)->Store(ns, layout, blocks);
  const size_t cached = (*shards)->MatchPrefix(ns, layout, chain);
  std::printf("stored %zu of %zu blocks; %zu of %zu prompt tokens cached\n", stored.size(), blocks.size(),
              cached * layout.tokens_per_block, tokens.size());
  if (stored.size() != blocks.size() || cached != chain.size()) return Fail("not every block was stored");

  // Every record read is checked against its CRC32C on the way in.
  const std::vector<absl::StatusOr<kvtier::cache::SharedRecord>> fetched = (*shards)->Fetch(ns, layout, chain);
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (!fetched[b].ok()) return Fail("block " + std::to_string(b) + ": " + fetched[b].status().ToString());
    if (**fetched[b] != blocks[b].records[0]) return Fail("block " + std::to_string(b) + " came back changed");
    absl::StatusOr<kvtier::kvblock::BlockView> view = kvtier::kvblock::ParseBlock(**fetched[b], &layout);
    std::vector<float> latents(values);
    if (!view.ok()) return Fail(view.status().ToString());
    if (absl::Status s = kvtier::kvblock::DecodeBlock(*view, latents); !s.ok()) return Fail(s.ToString());
  }
  std::printf("fetched %zu blocks (%zu bytes each), every one as stored\n", fetched.size(),
              blocks.front().records[0].size());
  return 0;
}
