// Host memory behind the slab contract that records each batch of runs it
// is asked to copy (a GPU waits once a batch), the records it checks, the
// host memory pinned for it, and the buffers it exports. Not thread-safe.
#ifndef KVTIER_TESTS_CACHE_STORE_RECORDING_SLAB_H_
#define KVTIER_TESTS_CACHE_STORE_RECORDING_SLAB_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "services/base/status.h"
#include "services/cache/store/slab_memory.h"

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
  absl::Status CopyInRunsNoWait(std::span<const SlabRun> runs) override {
    ++unwaited_in_batches;
    return CopyInRuns(runs);
  }
  absl::Status CopyOutRuns(std::span<const SlabRun> runs) const override {
    out_batches.emplace_back(runs.begin(), runs.end());
    return SlabMemory::CopyOutRuns(runs);
  }
  // As a GPU's: the records' CRCs computed where they lie (wrong ones on
  // request), the runs recorded as a batch.
  absl::Status CopyOutRunsWithCrc(std::span<const SlabRun> runs, std::span<const SlabRecord> records,
                                  uint32_t page_size, std::span<uint32_t> crcs) const override {
    out_batches.emplace_back(runs.begin(), runs.end());
    checked_records += records.size();
    absl::Status s = slab_->CopyOutRunsWithCrc(runs, records, page_size, crcs);
    if (wrong_crcs) {
      for (uint32_t& crc : crcs) crc ^= 1;
    }
    return s;
  }
  std::shared_ptr<uint8_t> AllocateHost(size_t n) const override { return slab_->AllocateHost(n); }
  absl::Status PinHost(void* p, size_t n) override {
    ++pin_calls;
    if (refuse_pins) return absl::InternalError("refused for the test");
    if (!pinned.emplace(static_cast<uint8_t*>(p), n).second) ++errors;  // pinned twice
    return absl::OkStatus();
  }
  void UnpinHost(void* p) override {
    auto it = pinned.find(static_cast<uint8_t*>(p));
    if (it == pinned.end()) {
      ++errors;  // never pinned
      return;
    }
    first_byte_unpinned = *it->first;  // still the memory that was pinned?
    pinned.erase(it);
  }
  // As a GPU's: a buffer of its own, named by a 64-byte handle (here the
  // count of exports, this one included: never all zeros), that copies out
  // of the slab land in.
  class HostExport final : public ExportedBuffer {
   public:
    HostExport(uint64_t bytes, int serial, std::shared_ptr<std::atomic<int>> live)
        : bytes_(bytes, '\0'), handle_(64, '\0'), live_(std::move(live)) {
      std::memcpy(handle_.data(), &serial, sizeof serial);
      ++*live_;
    }
    ~HostExport() override { --*live_; }
    uint64_t size() const override { return bytes_.size(); }
    std::string handle() const override { return handle_; }
    std::string& bytes() { return bytes_; }

   private:
    std::string bytes_;
    std::string handle_;
    std::shared_ptr<std::atomic<int>> live_;
  };
  absl::StatusOr<std::unique_ptr<ExportedBuffer>> Export(uint64_t bytes) override {
    auto buffer = std::make_unique<HostExport>(bytes, static_cast<int>(exported.size() + 1), live_exports);
    exported.push_back(buffer.get());
    return std::unique_ptr<ExportedBuffer>(std::move(buffer));
  }
  absl::Status CopyToExported(std::span<const ExportRun> runs, ExportedBuffer& to) override {
    export_batches.emplace_back(runs.begin(), runs.end());
    if (refuse_exports) return absl::InternalError("refused for the test");
    std::string& bytes = static_cast<HostExport&>(to).bytes();
    for (const ExportRun& r : runs) {
      if (r.to_offset > bytes.size() || r.n > bytes.size() - r.to_offset)
        return absl::InternalError("outside the buffer");
      KVTIER_RETURN_IF_ERROR(slab_->CopyOut(r.offset, bytes.data() + r.to_offset, r.n));
    }
    return absl::OkStatus();
  }

  // Whether [p, p + n) lies in pinned memory.
  bool IsPinned(const void* p, size_t n) const {
    const auto* q = static_cast<const uint8_t*>(p);
    auto it = pinned.upper_bound(const_cast<uint8_t*>(q));
    if (it == pinned.begin()) return false;
    --it;
    return q + n <= it->first + it->second;
  }

  void Clear() {
    in_batches.clear();
    out_batches.clear();
    unwaited_in_batches = 0;
  }
  // Bytes a batch copies.
  static size_t Bytes(const std::vector<SlabRun>& batch) {
    size_t n = 0;
    for (const SlabRun& r : batch) n += r.n;
    return n;
  }

  std::vector<std::vector<SlabRun>> in_batches;
  size_t unwaited_in_batches = 0;  // of in_batches, by CopyInRunsNoWait
  mutable std::vector<std::vector<SlabRun>> out_batches;
  mutable size_t checked_records = 0;  // CRCs computed by CopyOutRunsWithCrc
  bool wrong_crcs = false;
  std::map<uint8_t*, size_t> pinned;  // by address
  int pin_calls = 0;
  int errors = 0;  // pinned twice, or unpinned without a pin
  uint8_t first_byte_unpinned = 0;
  bool refuse_pins = false;
  // Every buffer exported, in order (each valid until its owner frees it).
  std::vector<HostExport*> exported;
  // The runs of each CopyToExported call (a GPU waits once a call).
  std::vector<std::vector<ExportRun>> export_batches;
  bool refuse_exports = false;  // CopyToExported fails
  // Buffers not yet freed (by whichever thread lets the last go).
  std::shared_ptr<std::atomic<int>> live_exports = std::make_shared<std::atomic<int>>(0);

 private:
  std::unique_ptr<StagedHostSlab> slab_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_TESTS_CACHE_STORE_RECORDING_SLAB_H_
