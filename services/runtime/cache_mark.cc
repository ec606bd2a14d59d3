#include "services/runtime/cache_mark.h"

#include <utility>

namespace kvtier::runtime {

CacheMark MarkCache(const SequenceCache& cache, size_t tokens) {
  CacheMark mark;
  mark.length = cache.length;
  // The tail holds the tokens past the last full block.
  const bool may_seal = static_cast<size_t>(cache.length % cache.tokens_per_block) + tokens >= cache.tokens_per_block;
  for (size_t l = 0; l < cache.tail.size(); ++l) {
    mark.blocks.push_back(cache.blocks[l].size());
    mark.tail_floats.push_back(cache.tail[l].size());
    if (may_seal) mark.tails.push_back(cache.tail[l]);
  }
  return mark;
}

void UndoToMark(SequenceCache& cache, CacheMark mark) {
  cache.length = mark.length;
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
