#include "services/runtime/v4_cache_parts.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kvtier/kernels/v4_entry.h"
#include "services/base/status.h"
#include "services/runtime/v4_forward.h"

namespace kvtier::runtime {
namespace {

absl::Status Check(const kernels::Status& s) { return FromKernelStatus(s); }

// The sizes every part is made of.
struct Dims {
  size_t hd, rd, ihd, window, entry, key;

  explicit Dims(const ModelConfig& c)
      : hd(c.v4->head_dim),
        rd(c.qk_rope_head_dim),
        ihd(c.indexer.has_value() ? c.indexer->head_dim : 0),
        window(c.v4->sliding_window),
        entry(kernels::V4EntryBytes(hd, rd)),
        key(ihd > 0 ? kernels::V4IndexKeyBytes(ihd) : 0) {}
};

// The config's part shape, over `ratios` (its compress ratios).
kernels::V4PartShape PartShape(const ModelConfig& c, std::vector<uint32_t>& ratios) {
  const Dims d(c);
  ratios.assign(c.v4->compress_ratios.begin(), c.v4->compress_ratios.end());
  return {ratios, d.hd, d.rd, d.ihd, d.window};
}

size_t Ratio(const ModelConfig& c, size_t layer) { return static_cast<size_t>(c.v4->compress_ratios[layer]); }

// Appends `floats` to `out` as their bytes.
void AppendFloats(const std::vector<float>& floats, std::vector<uint8_t>& out) {
  const size_t at = out.size();
  out.resize(at + floats.size() * sizeof(float));
  std::memcpy(out.data() + at, floats.data(), floats.size() * sizeof(float));
}

// Reads parts of a byte span front to back.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  std::span<const uint8_t> Take(size_t n) {
    const std::span<const uint8_t> part = bytes_.subspan(at_, n);
    at_ += n;
    return part;
  }
  std::vector<float> Floats(size_t n) {
    std::vector<float> values(n);
    std::memcpy(values.data(), Take(n * sizeof(float)).data(), n * sizeof(float));
    return values;
  }

 private:
  std::span<const uint8_t> bytes_;
  size_t at_ = 0;
};

}  // namespace

absl::Status CheckV4BlockTokens(const ModelConfig& c, uint32_t tokens_per_block) {
  if (!c.v4.has_value()) return absl::InvalidArgumentError("not a DeepSeek-V4 model");
  for (int64_t r : c.v4->compress_ratios) {
    if (tokens_per_block == 0 || (r > 0 && tokens_per_block % r != 0)) {
      return absl::InvalidArgumentError(absl::StrCat("tokens per block ", tokens_per_block,
                                                     " is not a multiple of every compress ratio (up to ",
                                                     c.v4->max_ratio(), ")"));
    }
  }
  return absl::OkStatus();
}

size_t V4BlockBytes(const ModelConfig& c, uint32_t tokens_per_block) {
  std::vector<uint32_t> ratios;
  return kernels::V4BlockBytes(PartShape(c, ratios), tokens_per_block);
}

// A restore point begins with its boundary, the int64 count of tokens before it.
static_assert(kernels::kV4BoundaryBytes == sizeof(int64_t));

size_t V4RestorePointBytes(const ModelConfig& c, int64_t boundary) {
  std::vector<uint32_t> ratios;
  return kernels::V4RestorePointBytes(PartShape(c, ratios), static_cast<uint64_t>(std::max<int64_t>(boundary, 0)));
}

absl::StatusOr<std::vector<uint8_t>> EncodeV4Block(const ModelConfig& c, const SequenceCache& cache, size_t block,
                                                   uint32_t tokens_per_block) {
  KVTIER_RETURN_IF_ERROR(CheckV4BlockTokens(c, tokens_per_block));
  if (cache.length < static_cast<int64_t>((block + 1) * tokens_per_block)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block ", block, " is not complete in a sequence of ", cache.length));
  }
  const Dims d(c);
  std::vector<uint8_t> out(V4BlockBytes(c, tokens_per_block));
  size_t at = 0;
  for (size_t l = 0; l < cache.v4.size(); ++l) {
    const size_t r = Ratio(c, l);
    if (r == 0) continue;
    const size_t first = block * tokens_per_block / r, count = tokens_per_block / r;
    const V4LayerState& st = cache.v4[l];
    for (size_t g = first; g < first + count; ++g, at += d.entry) {
      KVTIER_RETURN_IF_ERROR(Check(kernels::EncodeV4Entry(std::span(st.compressed).subspan(g * d.hd, d.hd), d.rd,
                                                          std::span(out).subspan(at, d.entry))));
    }
    if (r != 4) continue;
    for (size_t g = first; g < first + count; ++g, at += d.key) {
      KVTIER_RETURN_IF_ERROR(Check(kernels::EncodeV4IndexKey(std::span(st.index_keys).subspan(g * d.ihd, d.ihd),
                                                             std::span(out).subspan(at, d.key))));
    }
  }
  return out;
}

absl::StatusOr<std::vector<uint8_t>> EncodeV4RestorePoint(const ModelConfig& c, const SequenceCache& cache,
                                                          uint32_t tokens_per_block) {
  KVTIER_RETURN_IF_ERROR(CheckV4BlockTokens(c, tokens_per_block));
  const int64_t boundary = cache.length;
  if (boundary <= 0 || boundary % tokens_per_block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a restore point needs a block boundary; the sequence holds ", boundary, " tokens"));
  }
  const Dims d(c);
  std::vector<uint8_t> out(kernels::kV4BoundaryBytes);
  out.reserve(V4RestorePointBytes(c, boundary));
  std::memcpy(out.data(), &boundary, kernels::kV4BoundaryBytes);
  std::vector<uint8_t> entry(d.entry);
  for (size_t l = 0; l < cache.v4.size(); ++l) {
    const V4LayerState& st = cache.v4[l];
    for (int64_t p = std::max<int64_t>(0, boundary - static_cast<int64_t>(d.window)); p < boundary; ++p) {
      const size_t slot = static_cast<size_t>(p) % d.window;
      KVTIER_RETURN_IF_ERROR(
          Check(kernels::EncodeV4Entry(std::span(st.window).subspan(slot * d.hd, d.hd), d.rd, entry)));
      out.insert(out.end(), entry.begin(), entry.end());
    }
    if (Ratio(c, l) != 4) continue;
    for (const V4CompressorState* s : {&st.compressor, &st.index_compressor}) {
      AppendFloats(s->previous_kv, out);
      AppendFloats(s->previous_score, out);
    }
  }
  if (out.size() != V4RestorePointBytes(c, boundary)) {
    return absl::InternalError("a compressor's state does not hold its last group's rows");
  }
  return out;
}

absl::Status RestoreV4(const ModelConfig& c, std::span<const std::span<const uint8_t>> blocks,
                       std::span<const uint8_t> restore_point, uint32_t tokens_per_block, SequenceCache& cache) {
  KVTIER_RETURN_IF_ERROR(CheckV4BlockTokens(c, tokens_per_block));
  const int64_t boundary = static_cast<int64_t>(blocks.size()) * tokens_per_block;
  if (blocks.empty() || restore_point.size() != V4RestorePointBytes(c, boundary)) {
    return absl::InvalidArgumentError(absl::StrCat("a restore point after ", blocks.size(), " blocks has ",
                                                   V4RestorePointBytes(c, boundary), " bytes, not ",
                                                   restore_point.size()));
  }
  Reader point(restore_point);
  int64_t stored_boundary;
  std::memcpy(&stored_boundary, point.Take(kernels::kV4BoundaryBytes).data(), kernels::kV4BoundaryBytes);
  if (stored_boundary != boundary) {
    return absl::InvalidArgumentError(absl::StrCat("the restore point follows ", stored_boundary, " tokens, the ",
                                                   blocks.size(), " blocks hold ", boundary));
  }
  const Dims d(c);
  std::vector<V4LayerState> state = NewV4State(c);
  std::vector<float> values(d.hd);
  for (size_t b = 0; b < blocks.size(); ++b) {
    if (blocks[b].size() != V4BlockBytes(c, tokens_per_block)) {
      return absl::InvalidArgumentError(
          absl::StrCat("block ", b, " has ", blocks[b].size(), " bytes, not ", V4BlockBytes(c, tokens_per_block)));
    }
    Reader in(blocks[b]);
    for (size_t l = 0; l < state.size(); ++l) {
      const size_t r = Ratio(c, l);
      if (r == 0) continue;
      for (size_t g = 0; g < tokens_per_block / r; ++g) {
        KVTIER_RETURN_IF_ERROR(Check(kernels::DecodeV4Entry(in.Take(d.entry), d.rd, values)));
        state[l].compressed.insert(state[l].compressed.end(), values.begin(), values.end());
      }
      if (r != 4) continue;
      std::vector<float> key(d.ihd);
      for (size_t g = 0; g < tokens_per_block / r; ++g) {
        KVTIER_RETURN_IF_ERROR(Check(kernels::DecodeV4IndexKey(in.Take(d.key), key)));
        state[l].index_keys.insert(state[l].index_keys.end(), key.begin(), key.end());
      }
    }
  }
  for (size_t l = 0; l < state.size(); ++l) {
    for (int64_t p = std::max<int64_t>(0, boundary - static_cast<int64_t>(d.window)); p < boundary; ++p) {
      const size_t slot = static_cast<size_t>(p) % d.window;
      KVTIER_RETURN_IF_ERROR(Check(
          kernels::DecodeV4Entry(point.Take(d.entry), d.rd, std::span(state[l].window).subspan(slot * d.hd, d.hd))));
    }
    if (Ratio(c, l) != 4) continue;
    for (auto [s, dim] : {std::pair{&state[l].compressor, d.hd}, {&state[l].index_compressor, d.ihd}}) {
      s->previous_kv = point.Floats(4 * dim);
      s->previous_score = point.Floats(4 * dim);
      // The model's rows are finite; one that is not would turn every
      // later entry of the layer to NaN.
      for (const std::vector<float>* rows : {&s->previous_kv, &s->previous_score}) {
        if (!std::all_of(rows->begin(), rows->end(), [](float v) { return std::isfinite(v); })) {
          return absl::InvalidArgumentError(
              absl::StrCat("the restore point's overlap rows of layer ", l, " hold a value that is not finite"));
        }
      }
    }
  }
  cache.v4 = std::move(state);
  cache.length = boundary;
  return absl::OkStatus();
}

}  // namespace kvtier::runtime
