// Timing in-process decode steps, as decode_bench and serving_bench both do:
// every sequence takes one token a step, all in one batch.
#ifndef KVTIER_LOAD_DECODE_STEPS_H_
#define KVTIER_LOAD_DECODE_STEPS_H_

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "services/runtime/model.h"

namespace kvtier::load {

// Steps every cache of `caches` `steps` times (feeding token `token`); the
// seconds it took, or the first error.
inline absl::StatusOr<double> TimeDecodeSteps(const runtime::Model& model, std::vector<runtime::SequenceCache>& caches,
                                              uint64_t steps, uint32_t token = 5) {
  // The logits in one buffer, row after row, as the decode batcher keeps
  // them (Forward writes straight into it).
  const size_t vocab = static_cast<size_t>(model.config().vocab_size);
  std::vector<float> logits(caches.size() * vocab);
  std::vector<uint32_t> next(caches.size(), token);
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t s = 0; s < steps; ++s) {
    std::vector<runtime::SequenceTokens> rows;
    for (size_t b = 0; b < caches.size(); ++b) {
      rows.push_back({std::span(&next[b], 1), &caches[b], std::span(logits).subspan(b * vocab, vocab)});
    }
    if (absl::Status status = model.Forward(rows); !status.ok()) return status;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kvtier::load

#endif  // KVTIER_LOAD_DECODE_STEPS_H_
