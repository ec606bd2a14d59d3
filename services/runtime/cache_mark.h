// A sequence cache's state before a forward pass, kept so that a pass that
// failed part way (some layers' latents appended or sealed, others not) can
// be undone: the decode worker then runs the batch's sequences one at a
// time, so that only a sequence whose own latents break the pass fails.
#ifndef KVTIER_SERVICES_RUNTIME_CACHE_MARK_H_
#define KVTIER_SERVICES_RUNTIME_CACHE_MARK_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "services/runtime/model.h"

namespace kvtier::runtime {

// A V4 compressor before the pass: how many open rows it held (a pass that
// closes no group only appends to them), or, when the pass may close a
// group (which clears them and replaces the last group's), all of it.
struct V4CompressorMark {
  size_t kv = 0, score = 0;
  std::optional<V4CompressorState> whole = std::nullopt;
};

// A DeepSeek-V4 layer's state before the pass: the window slots the pass
// overwrites (from slot `first_slot` on, wrapping), how many compressed
// entries and keys it held, and its compressors.
struct V4LayerMark {
  size_t first_slot = 0;
  std::vector<float> slots;
  size_t compressed = 0, index_keys = 0;
  V4CompressorMark compressor, index_compressor;
};

struct CacheMark {
  int64_t length = 0;
  std::vector<size_t> blocks, tail_floats;  // [layer]
  std::vector<std::vector<float>> tails;    // [layer]; only when a block may seal
  std::vector<V4LayerMark> v4;              // [layer] of a V4 sequence
};

// Marks `cache`, a sequence of `config`'s model, before a pass of `tokens`
// more tokens. The tails are copied
// only when the pass can fill a block (sealing moves tail rows into it);
// otherwise the mark is a few counts. A V4 sequence's mark copies the
// window slots the pass overwrites, and its compressors only where the
// pass may close a group.
CacheMark MarkCache(const SequenceCache& cache, size_t tokens, const ModelConfig& config);

// Puts `cache` back as it was when marked (`config`: the model's).
void UndoToMark(SequenceCache& cache, CacheMark mark, const ModelConfig& config);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_CACHE_MARK_H_
