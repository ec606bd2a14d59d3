// Host memory behind the slab contract whose PinHost, like a GPU driver's
// page-locking of a large range, takes as long as the test says: it waits
// at a gate until the test opens it. Thread-safe.
#ifndef KVTIER_TESTS_CACHE_STORE_GATED_PIN_SLAB_H_
#define KVTIER_TESTS_CACHE_STORE_GATED_PIN_SLAB_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "services/cache/store/slab_memory.h"

namespace kvtier::cache {

class GatedPinSlab final : public SlabMemory {
 public:
  explicit GatedPinSlab(uint64_t bytes) : slab_(*StagedHostSlab::Create(bytes)) {}
  uint64_t size() const override { return slab_->size(); }
  std::string name() const override { return "gated pins"; }
  absl::Status CopyIn(uint64_t offset, const void* from, size_t n) override { return slab_->CopyIn(offset, from, n); }
  absl::Status CopyOut(uint64_t offset, void* to, size_t n) const override { return slab_->CopyOut(offset, to, n); }
  std::shared_ptr<uint8_t> AllocateHost(size_t n) const override { return slab_->AllocateHost(n); }
  absl::Status PinHost(void* /*p*/, size_t /*n*/) override {
    {
      absl::MutexLock lock(&mu_);
      ++pins_started_;
    }
    pinning.Notify();
    open.WaitForNotification();
    return absl::OkStatus();
  }
  int pins_started() {
    absl::MutexLock lock(&mu_);
    return pins_started_;
  }

  absl::Notification pinning;  // a pin has started
  absl::Notification open;     // pins may finish

 private:
  std::unique_ptr<StagedHostSlab> slab_;
  absl::Mutex mu_;
  int pins_started_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvtier::cache

#endif  // KVTIER_TESTS_CACHE_STORE_GATED_PIN_SLAB_H_
