#include "services/cache/store/recency_or_frequency.h"

#include <algorithm>
#include <cmath>

namespace kvtier::cache {

RecencyOrFrequency::RecencyOrFrequency(uint64_t half_life_bytes)
    : half_life_bytes_(static_cast<double>(std::max<uint64_t>(half_life_bytes, 1))) {}

double RecencyOrFrequency::Now() const { return static_cast<double>(clock_bytes_) / half_life_bytes_; }

double RecencyOrFrequency::AddUse(double score, double stamp) {
  const double high = std::max(score, stamp), low = std::min(score, stamp);
  return high + std::log2(1 + std::exp2(low - high));
}

UseKey RecencyOrFrequency::Stored(uint64_t fingerprint, double stamp, size_t held_blocks) {
  frequency_share_.Returning(fingerprint, held_blocks);
  const std::optional<double> before = scores_.Take(fingerprint);
  return {before.has_value() ? AddUse(*before, stamp) : stamp, -++ties_};
}

UseKey RecencyOrFrequency::Used(const UseKey& before) { return {AddUse(before.first, Now()), ++ties_}; }

RecencyOrFrequency::Choice RecencyOrFrequency::Choose(double recency_victim_score, double frequency_victim_score,
                                                      double probation_share) {
  if (probation_share > 0.5 || recency_victim_score - frequency_victim_score < 1) return Choice::kAgreed;
  frequency_due_ += frequency_share_.share();
  if (frequency_due_ < 1) return Choice::kRecency;
  frequency_due_ -= 1;
  return Choice::kFrequency;
}

void RecencyOrFrequency::Evicted(uint64_t fingerprint, double score, Choice chosen_by, size_t held_blocks) {
  scores_.Add(fingerprint, 4 * held_blocks, score);
  // Recency's victim coming back says frequency would have kept it.
  if (chosen_by != Choice::kAgreed) frequency_share_.Evicted(fingerprint, chosen_by == Choice::kRecency, held_blocks);
}

size_t RecencyOrFrequency::MemoryBytes() const { return frequency_share_.MemoryBytes() + scores_.MemoryBytes(); }

}  // namespace kvtier::cache
