#include "services/serving/concurrency_bound.h"

#include "absl/strings/str_cat.h"

namespace kvtier::serving {

absl::StatusOr<std::shared_ptr<void>> ConcurrencyBound::Hold(const std::string& key) {
  {
    absl::MutexLock lock(&mu_);
    uint64_t& held = held_[key];
    if (held >= most_) {
      return absl::ResourceExhaustedError(
          absl::StrCat(what_, " ", key, ": ", held, " under way, the most at once (", flag_, "); retry later"));
    }
    ++held;
  }
  // Owns nothing: its deleter gives the place back.
  return std::shared_ptr<void>(this, [key](void* bound) { static_cast<ConcurrencyBound*>(bound)->Release(key); });
}

uint64_t ConcurrencyBound::Held(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(key);
  return it == held_.end() ? 0 : it->second;
}

void ConcurrencyBound::Release(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = held_.find(key);
  if (--it->second == 0) held_.erase(it);
}

}  // namespace kvtier::serving
