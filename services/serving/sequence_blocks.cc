#include "services/serving/sequence_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/sha256.h"

namespace kvtier::serving {

namespace fs = std::filesystem;

kvblock::LatentLayout ModelLayout(const runtime::ModelConfig& config, const std::string& model_id, kernels::Codec codec,
                                  uint32_t tokens_per_block) {
  kvblock::LatentLayout layout;
  layout.model_id = model_id;
  layout.num_layers = static_cast<uint32_t>(config.num_hidden_layers);
  layout.tokens_per_block = tokens_per_block;
  if (config.v4.has_value()) {  // entries in the model's own FP8, whatever `codec`
    layout.kv_lora_rank = static_cast<uint32_t>(config.v4->head_dim);
    layout.rope_dim = static_cast<uint32_t>(config.qk_rope_head_dim);
    layout.codec = kernels::Codec::kFp8;
    layout.compress_ratios.assign(config.v4->compress_ratios.begin(), config.v4->compress_ratios.end());
    layout.sliding_window = static_cast<uint32_t>(config.v4->sliding_window);
    if (config.indexer.has_value() && std::ranges::find(layout.compress_ratios, 4u) != layout.compress_ratios.end()) {
      layout.indexer_dim = static_cast<uint32_t>(config.indexer->head_dim);
      layout.indexer_encoding = kvblock::IndexerEncoding::kMxfp4;
    }
    layout.block_format_version = kvblock::kV4BlockFormatVersion;
    return layout;
  }
  layout.kv_lora_rank = static_cast<uint32_t>(config.kv_lora_rank);
  layout.rope_dim = static_cast<uint32_t>(config.qk_rope_head_dim);
  layout.codec = codec;
  if (config.indexer.has_value()) {
    layout.indexer_dim = static_cast<uint32_t>(config.indexer->head_dim);
    layout.indexer_encoding = kvblock::IndexerEncoding::kFp8;
  }
  layout.block_format_version = kvblock::FormatVersionFor(layout.indexer_encoding);
  return layout;
}

absl::StatusOr<std::string> ModelId(const std::string& checkpoint_dir, runtime::ModelType model_type) {
  std::vector<fs::path> files = {fs::path(checkpoint_dir) / "config.json"};
  std::error_code error;
  for (const fs::directory_entry& e : fs::directory_iterator(checkpoint_dir, error)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  }
  if (error) return absl::NotFoundError(absl::StrCat("cannot list ", checkpoint_dir, ": ", error.message()));
  std::sort(files.begin() + 1, files.end());
  constexpr size_t kEdge = 1 << 20;
  std::string material;
  for (const fs::path& path : files) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
    const size_t size = fs::file_size(path, error);
    absl::StrAppend(&material, path.filename().string(), ":", size, ":");
    std::string edge(std::min(size, kEdge), '\0');
    in.read(edge.data(), static_cast<std::streamsize>(edge.size()));
    material += edge;
    if (size > kEdge) {
      in.seekg(static_cast<std::streamoff>(size - std::min(size - kEdge, kEdge)));
      edge.assign(std::min(size - kEdge, kEdge), '\0');
      in.read(edge.data(), static_cast<std::streamsize>(edge.size()));
      material += edge;
    }
    if (!in) return absl::DataLossError(absl::StrCat("short read of ", path.string()));
  }
  const kvblock::Sha256Digest digest = kvblock::Sha256({material});
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id = absl::StrCat(runtime::ModelTypeName(model_type), "-");
  for (int i = 0; i < 8; ++i) id += {kHex[digest[i] >> 4], kHex[digest[i] & 15]};
  return id;
}

namespace {

// Appends layer `layer`'s indexer keys of tokens [first, first + count) in
// the record's encoding: their codes, then their scales.
void AppendIndexerKeys(const runtime::SequenceCache& cache, size_t layer, size_t first, size_t count, size_t dim,
                       std::string& out) {
  out.append(reinterpret_cast<const char*>(cache.index_keys[layer].data() + first * dim), count * dim);
  out.append(reinterpret_cast<const char*>(cache.index_scales[layer].data() + first), count * sizeof(float));
}

// OK when `part` (`count` keys in the record's encoding) holds keys the
// model can make; INVALID_ARGUMENT for a NaN code or a scale that is not
// finite and positive: scoring over them would choose tokens at random.
absl::Status CheckIndexerKeys(std::string_view part, size_t count, size_t dim, size_t layer) {
  const auto* codes = reinterpret_cast<const uint8_t*>(part.data());
  for (size_t i = 0; i < count * dim; ++i) {
    if ((codes[i] & 0x7f) == 0x7f) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", layer, ": indexer key ", i / dim, " has a NaN code"));
    }
  }
  for (size_t t = 0; t < count; ++t) {
    float scale;
    std::memcpy(&scale, part.data() + count * dim + t * sizeof scale, sizeof scale);
    if (!std::isfinite(scale) || scale <= 0.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, ": indexer key ", t, " has scale ", scale, ", not finite and positive"));
    }
  }
  return absl::OkStatus();
}

// Appends the `count` keys of a checked `part` to layer `layer`'s.
void AddIndexerKeys(std::string_view part, size_t count, size_t dim, runtime::SequenceCache& cache, size_t layer) {
  const auto* codes = reinterpret_cast<const uint8_t*>(part.data());
  cache.index_keys[layer].insert(cache.index_keys[layer].end(), codes, codes + count * dim);
  std::vector<float>& scales = cache.index_scales[layer];
  scales.resize(scales.size() + count);
  std::memcpy(scales.data() + scales.size() - count, part.data() + count * dim, count * sizeof(float));
}

}  // namespace

absl::StatusOr<std::string> BlockRecord(const kvblock::LatentLayout& layout, const runtime::SequenceCache& cache,
                                        size_t block, uint32_t layer_begin, uint32_t layer_count) {
  if (layer_begin + layer_count > cache.blocks.size() || layer_count == 0) {
    return absl::InvalidArgumentError("layer range outside the cache");
  }
  std::string payloads;
  for (uint32_t l = layer_begin; l < layer_begin + layer_count; ++l) {
    if (block >= cache.blocks[l].size())
      return absl::InvalidArgumentError(absl::StrCat("block ", block, " is not sealed"));
    const runtime::SealedBlock& p = cache.blocks[l][block];
    payloads.append(reinterpret_cast<const char*>(p.data()), p.size());
    if (layout.indexer_dim > 0) {
      const size_t first = block * layout.tokens_per_block;
      if (cache.index_scales[l].size() < first + layout.tokens_per_block) {
        return absl::InvalidArgumentError(absl::StrCat("block ", block, " lacks its indexer keys"));
      }
      AppendIndexerKeys(cache, l, first, layout.tokens_per_block, layout.indexer_dim, payloads);
    }
  }
  return kvblock::SerializeBlock(kvblock::HeaderFor(layout, layer_begin, layer_count), payloads);
}

runtime::SequenceCache EmptyCache(const kvblock::LatentLayout& layout) {
  runtime::SequenceCache cache{.codec = layout.codec,
                               .tokens_per_block = layout.tokens_per_block,
                               .blocks = std::vector<std::vector<runtime::SealedBlock>>(layout.num_layers),
                               .tail = std::vector<std::vector<float>>(layout.num_layers)};
  if (layout.indexer_dim > 0) {
    cache.index_keys.resize(layout.num_layers);
    cache.index_scales.resize(layout.num_layers);
  }
  return cache;
}

absl::Status AppendBlockRecord(cache::SharedRecord record, const kvblock::LatentLayout& layout,
                               runtime::SequenceCache& cache, kvblock::CrcCheck crc_check) {
  if (!std::all_of(cache.tail.begin(), cache.tail.end(), [](const auto& t) { return t.empty(); }) ||
      cache.blocks.size() != layout.num_layers || cache.codec != layout.codec ||
      cache.tokens_per_block != layout.tokens_per_block) {
    return absl::FailedPreconditionError("the sequence cache does not take whole blocks of this layout");
  }
  if (record == nullptr) return absl::InvalidArgumentError("no record");
  KVTIER_ASSIGN_OR_RETURN(kvblock::BlockView view, kvblock::ParseBlock(*record, &layout, crc_check));
  if (view.header.layer_begin != 0 || view.header.layer_count != layout.num_layers) {
    return absl::InvalidArgumentError("the record does not hold every layer");
  }
  const size_t sealed = cache.length;
  if (layout.indexer_dim > 0) {
    if (cache.index_scales.size() != layout.num_layers || cache.index_keys.size() != layout.num_layers) {
      return absl::FailedPreconditionError("the sequence cache has no room for indexer keys");
    }
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      if (cache.index_scales[l].size() != sealed || cache.index_keys[l].size() != sealed * layout.indexer_dim) {
        return absl::FailedPreconditionError("the sequence cache's indexer keys are not those of its blocks");
      }
    }
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      KVTIER_RETURN_IF_ERROR(CheckIndexerKeys(view.IndexerPart(l), layout.tokens_per_block, layout.indexer_dim, l));
    }
    for (uint32_t l = 0; l < layout.num_layers; ++l) {
      AddIndexerKeys(view.IndexerPart(l), layout.tokens_per_block, layout.indexer_dim, cache, l);
    }
  }
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    const std::string_view payload = view.LatentPart(l);
    cache.blocks[l].emplace_back(record, std::span(reinterpret_cast<const uint8_t*>(payload.data()), payload.size()));
  }
  cache.length += layout.tokens_per_block;
  return absl::OkStatus();
}

std::string TailBytes(const runtime::SequenceCache& cache) {
  std::string bytes;
  for (const std::vector<float>& t : cache.tail) {
    bytes.append(reinterpret_cast<const char*>(t.data()), t.size() * sizeof(float));
  }
  return bytes;
}

std::string TailIndexerKeys(const runtime::SequenceCache& cache, const kvblock::LatentLayout& layout) {
  std::string bytes;
  if (layout.indexer_dim == 0) return bytes;
  const size_t sealed = cache.blocks.empty() ? 0 : cache.blocks[0].size() * size_t{layout.tokens_per_block};
  for (size_t l = 0; l < cache.index_scales.size(); ++l) {
    AppendIndexerKeys(cache, l, sealed, static_cast<size_t>(cache.length) - sealed, layout.indexer_dim, bytes);
  }
  return bytes;
}

absl::Status SetTail(std::string_view bytes, std::string_view indexer_keys, uint32_t token_count,
                     const kvblock::LatentLayout& layout, runtime::SequenceCache& cache) {
  const size_t row = size_t{layout.kv_lora_rank} + layout.rope_dim;
  const size_t per_layer = size_t{token_count} * row;
  if (token_count >= layout.tokens_per_block || bytes.size() != per_layer * layout.num_layers * sizeof(float) ||
      cache.tail.size() != layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat("tail of ", token_count, " tokens must be ",
                                                   per_layer * layout.num_layers * sizeof(float),
                                                   " bytes (fewer than tokens_per_block tokens), got ", bytes.size()));
  }
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    std::vector<float>& t = cache.tail[l];
    t.resize(per_layer);
    if (per_layer == 0) continue;  // a sequence of whole blocks: no tail
    std::memcpy(t.data(), bytes.data() + l * per_layer * sizeof(float), per_layer * sizeof(float));
    for (size_t i = 0; i < t.size(); ++i) {
      if (!std::isfinite(t[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("tail latent ", i % row, " of token ", i / row, " in layer ", l, " is not finite"));
      }
    }
  }
  const size_t sealed = cache.blocks.empty() ? 0 : cache.blocks[0].size() * size_t{layout.tokens_per_block};
  const size_t keys_per_layer = kvblock::IndexerPartBytes(layout.indexer_encoding, token_count, layout.indexer_dim);
  if (indexer_keys.size() != keys_per_layer * layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the tail's indexer keys must be ", keys_per_layer * layout.num_layers, " bytes, got ", indexer_keys.size()));
  }
  for (uint32_t l = 0; keys_per_layer > 0 && l < layout.num_layers; ++l) {
    if (cache.index_scales[l].size() != sealed) {
      return absl::FailedPreconditionError("the sequence cache's indexer keys are not those of its blocks");
    }
    const std::string_view part = indexer_keys.substr(l * keys_per_layer, keys_per_layer);
    KVTIER_RETURN_IF_ERROR(CheckIndexerKeys(part, token_count, layout.indexer_dim, l));
    AddIndexerKeys(part, token_count, layout.indexer_dim, cache, l);
  }
  cache.length = static_cast<int64_t>(sealed + token_count);
  return absl::OkStatus();
}

}  // namespace kvtier::serving
