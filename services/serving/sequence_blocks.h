// A sequence's latents (runtime::SequenceCache) to and from what travels
// between the services: block-format records (one per block, or one per
// layer slice) and the float tail of a DecodeRequest.
#ifndef KVTIER_SERVICES_SERVING_SEQUENCE_BLOCKS_H_
#define KVTIER_SERVICES_SERVING_SEQUENCE_BLOCKS_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "services/cache/client/shared_record.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/layout.h"
#include "services/runtime/checkpoint.h"
#include "services/runtime/model.h"

namespace kvtier::serving {

// The layout of `config`'s latents stored in `codec`, blocks of
// `tokens_per_block`, for the model `model_id` (see ModelId). A DeepSeek-V4
// config's is its format 3 layout (v4_records.h), whose entries are the
// model's own FP8 whatever `codec` says.
kvblock::LatentLayout ModelLayout(const runtime::ModelConfig& config, const std::string& model_id, kernels::Codec codec,
                                  uint32_t tokens_per_block);

// Names a checkpoint's weights, so blocks of different models never share
// keys: its model_type ("deepseek_v2", "deepseek_v3", "kimi_k2",
// "deepseek_v32"), "-", and 16 hex digits of SHA-256 over config.json and
// each weights file's name, size, first and last MiB. Reads at most 2 MiB a
// file.
absl::StatusOr<std::string> ModelId(const std::string& checkpoint_dir, runtime::ModelType model_type);

// Layers [layer_begin, layer_begin + layer_count) of sealed block `block`
// of `cache` as one record.
absl::StatusOr<std::string> BlockRecord(const kvblock::LatentLayout& layout, const runtime::SequenceCache& cache,
                                        size_t block, uint32_t layer_begin, uint32_t layer_count);

// An empty sequence cache of `layout`'s layers, codec, block size and
// indexer keys: what a worker without the model at hand appends fetched
// blocks to.
runtime::SequenceCache EmptyCache(const kvblock::LatentLayout& layout);

// Appends an all-layer record of `layout` as the next sealed block of
// `cache`, which must hold whole blocks only (an empty tail). The record is
// parsed without trust: its layout and sizes are checked, and its CRC
// unless `crc_check` says that was done where the bytes landed (as
// cache::ShardSet::Fetch does); indexer keys the model could not have made are
// refused (INVALID_ARGUMENT). The block's latents are views into the
// record, which they keep alive; its indexer keys are copied beside the
// cache's others.
absl::Status AppendBlockRecord(cache::SharedRecord record, const kvblock::LatentLayout& layout,
                               runtime::SequenceCache& cache, kvblock::CrcCheck crc_check = kvblock::CrcCheck::kCheck);

// The tail (tokens after the last sealed block) as TailLatents.latents:
// float32 [layers][tokens][kv_lora_rank + rope_dim].
std::string TailBytes(const runtime::SequenceCache& cache);
// The tail's indexer keys as TailLatents.indexer_keys: [layers] of the
// record's indexer part for the tail's tokens. Empty for a layout without.
std::string TailIndexerKeys(const runtime::SequenceCache& cache, const kvblock::LatentLayout& layout);

// Sets `cache`'s tail to `token_count` tokens read from `bytes` and
// `indexer_keys` (the formats TailBytes and TailIndexerKeys write) and its
// length to the sealed tokens plus them. INVALID_ARGUMENT for a size that
// does not match, a non-finite latent, or a key the model could not have
// made (a NaN code, a scale not finite and positive).
absl::Status SetTail(std::string_view bytes, std::string_view indexer_keys, uint32_t token_count,
                     const kvblock::LatentLayout& layout, runtime::SequenceCache& cache);

}  // namespace kvtier::serving

#endif  // KVTIER_SERVICES_SERVING_SEQUENCE_BLOCKS_H_
