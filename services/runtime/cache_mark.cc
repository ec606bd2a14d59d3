#include "services/runtime/cache_mark.h"

#include <algorithm>
#include <utility>

namespace kvtier::runtime {

namespace {

// A V4 window ring's slots and the floats of each.
struct Ring {
  size_t slots = 0, width = 0;
  explicit Ring(const ModelConfig& c)
      : slots(c.v4.has_value() ? static_cast<size_t>(c.v4->sliding_window) : 0),
        width(c.v4.has_value() ? static_cast<size_t>(c.v4->head_dim) : 0) {}
  // Where slot i (wrapping) begins.
  ptrdiff_t Offset(size_t i) const { return static_cast<ptrdiff_t>(i % slots * width); }
};

V4CompressorMark MarkCompressor(const V4CompressorState& s, bool may_close) {
  V4CompressorMark m{.kv = s.kv.size(), .score = s.score.size()};
  if (may_close) m.whole = s;
  return m;
}

void UndoCompressor(V4CompressorState& s, V4CompressorMark& m) {
  if (m.whole.has_value()) {
    s = std::move(*m.whole);
  } else {
    s.kv.resize(m.kv);
    s.score.resize(m.score);
  }
}

}  // namespace

CacheMark MarkCache(const SequenceCache& cache, size_t tokens, const ModelConfig& config) {
  CacheMark mark;
  mark.length = cache.length;
  const Ring ring(config);
  for (size_t l = 0; l < cache.v4.size(); ++l) {
    const V4LayerState& layer = cache.v4[l];
    V4LayerMark& m = mark.v4.emplace_back();
    m.first_slot = static_cast<size_t>(cache.length) % ring.slots;
    for (size_t i = 0; i < std::min(tokens, ring.slots); ++i) {
      const auto slot = layer.window.begin() + ring.Offset(m.first_slot + i);
      m.slots.insert(m.slots.end(), slot, slot + static_cast<ptrdiff_t>(ring.width));
    }
    m.compressed = layer.compressed.size();
    m.index_keys = layer.index_keys.size();
    const int64_t ratio = config.v4->compress_ratios[l];
    const bool may_close = ratio > 0 && cache.length % ratio + static_cast<int64_t>(tokens) >= ratio;
    m.compressor = MarkCompressor(layer.compressor, may_close);
    m.index_compressor = MarkCompressor(layer.index_compressor, may_close);
  }
  // The tail holds the tokens past the last full block.
  const bool may_seal = static_cast<size_t>(cache.length % cache.tokens_per_block) + tokens >= cache.tokens_per_block;
  for (size_t l = 0; l < cache.tail.size(); ++l) {
    mark.blocks.push_back(cache.blocks[l].size());
    mark.tail_floats.push_back(cache.tail[l].size());
    if (may_seal) mark.tails.push_back(cache.tail[l]);
  }
  return mark;
}

void UndoToMark(SequenceCache& cache, CacheMark mark, const ModelConfig& config) {
  cache.length = mark.length;
  const Ring ring(config);
  for (size_t l = 0; l < mark.v4.size(); ++l) {
    V4LayerState& layer = cache.v4[l];
    V4LayerMark& m = mark.v4[l];
    for (size_t i = 0; i * ring.width < m.slots.size(); ++i) {
      std::copy_n(m.slots.begin() + static_cast<ptrdiff_t>(i * ring.width), ring.width,
                  layer.window.begin() + ring.Offset(m.first_slot + i));
    }
    layer.compressed.resize(m.compressed);
    layer.index_keys.resize(m.index_keys);
    UndoCompressor(layer.compressor, m.compressor);
    UndoCompressor(layer.index_compressor, m.index_compressor);
  }
  for (size_t l = 0; l < cache.tail.size(); ++l) {
    std::vector<SealedBlock>& blocks = cache.blocks[l];
    blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(mark.blocks[l]), blocks.end());
    if (mark.tails.empty()) {
      cache.tail[l].resize(mark.tail_floats[l]);
    } else {
      cache.tail[l] = std::move(mark.tails[l]);
    }
  }
}

}  // namespace kvtier::runtime
