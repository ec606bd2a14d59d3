// Host memory behind the slab contract that records each batch of runs it
// is asked to copy (a GPU waits once a batch). Not thread-safe.
#ifndef KVTIER_TESTS_CACHE_RECORDING_SLAB_H_
#define KVTIER_TESTS_CACHE_RECORDING_SLAB_H_

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "services/cache/slab_memory.h"

namespace kvtier::cache {

class RecordingSlab final : public SlabMemory {
 public:
  explicit RecordingSlab(uint64_t bytes) : slab_(*StagedHostSlab::Create(bytes)) {}
  uint64_t size() const override { return slab_->size(); }
  std::string name() const override { return "recording"; }
  absl::Status CopyIn(uint64_t offset, const void* from, size_t n) override { return slab_->CopyIn(offset, from, n); }
  absl::Status CopyOut(uint64_t offset, void* to, size_t n) const override { return slab_->CopyOut(offset, to, n); }
  absl::Status CopyInRuns(std::span<const SlabRun> runs) override {
    in_batches.emplace_back(runs.begin(), runs.end());
    return SlabMemory::CopyInRuns(runs);
  }
  absl::Status CopyOutRuns(std::span<const SlabRun> runs) const override {
    out_batches.emplace_back(runs.begin(), runs.end());
    return SlabMemory::CopyOutRuns(runs);
  }
  std::shared_ptr<uint8_t> AllocateHost(size_t n) const override { return slab_->AllocateHost(n); }

  void Clear() {
    in_batches.clear();
    out_batches.clear();
  }
  // Bytes a batch copies.
  static size_t Bytes(const std::vector<SlabRun>& batch) {
    size_t n = 0;
    for (const SlabRun& r : batch) n += r.n;
    return n;
  }

  std::vector<std::vector<SlabRun>> in_batches;
  mutable std::vector<std::vector<SlabRun>> out_batches;

 private:
  std::unique_ptr<StagedHostSlab> slab_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_TESTS_CACHE_RECORDING_SLAB_H_
