#include "services/serving/sequence_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "services/common/status.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/sha256.h"

namespace kvtier::serving {

namespace fs = std::filesystem;

kvblock::LatentLayout ModelLayout(const runtime::ModelConfig& config, const std::string& model_id, kernels::Codec codec,
                                  uint32_t tokens_per_block) {
  kvblock::LatentLayout layout;
  layout.model_id = model_id;
  layout.num_layers = static_cast<uint32_t>(config.num_hidden_layers);
  layout.kv_lora_rank = static_cast<uint32_t>(config.kv_lora_rank);
  layout.rope_dim = static_cast<uint32_t>(config.qk_rope_head_dim);
  layout.tokens_per_block = tokens_per_block;
  layout.codec = codec;
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
  }
  return kvblock::SerializeBlock(kvblock::HeaderFor(layout, layer_begin, layer_count), payloads);
}

runtime::SequenceCache EmptyCache(const kvblock::LatentLayout& layout) {
  return {.codec = layout.codec,
          .tokens_per_block = layout.tokens_per_block,
          .blocks = std::vector<std::vector<runtime::SealedBlock>>(layout.num_layers),
          .tail = std::vector<std::vector<float>>(layout.num_layers)};
}

absl::Status AppendBlockRecord(SharedRecord record, const kvblock::LatentLayout& layout, runtime::SequenceCache& cache,
                               kvblock::CrcCheck crc_check) {
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
  for (uint32_t l = 0; l < layout.num_layers; ++l) {
    const std::string_view payload = view.Layer(l);
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

absl::Status SetTail(std::string_view bytes, uint32_t token_count, const kvblock::LatentLayout& layout,
                     runtime::SequenceCache& cache) {
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
  cache.length =
      static_cast<int64_t>(cache.blocks.empty() ? 0 : cache.blocks[0].size()) * layout.tokens_per_block + token_count;
  return absl::OkStatus();
}

}  // namespace kvtier::serving
