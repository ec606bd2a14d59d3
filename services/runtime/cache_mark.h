// A sequence cache's state before a forward pass, kept so that a pass that
// failed part way (some layers' latents appended or sealed, others not) can
// be undone: the decode worker then runs the batch's sequences one at a
// time, so that only a sequence whose own latents break the pass fails.
#ifndef KVTIER_SERVICES_RUNTIME_CACHE_MARK_H_
#define KVTIER_SERVICES_RUNTIME_CACHE_MARK_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "services/runtime/model.h"

namespace kvtier::runtime {

struct CacheMark {
  int64_t length = 0;
  std::vector<size_t> blocks, tail_floats;  // [layer]
  std::vector<std::vector<float>> tails;    // [layer]; only when a block may seal
};

// Marks `cache` before a pass of `tokens` more tokens. The tails are copied
// only when the pass can fill a block (sealing moves tail rows into it);
// otherwise the mark is a few counts.
CacheMark MarkCache(const SequenceCache& cache, size_t tokens);

// Puts `cache` back as it was when marked.
void UndoToMark(SequenceCache& cache, CacheMark mark);

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_CACHE_MARK_H_
