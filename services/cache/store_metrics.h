// Exposes the store's counters to Prometheus, read from BlockStore::Stats at
// scrape time, so a scrape and a Stats RPC report the same figures.
#ifndef KVTIER_SERVICES_CACHE_STORE_METRICS_H_
#define KVTIER_SERVICES_CACHE_STORE_METRICS_H_

#include <string>
#include <vector>

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include "services/cache/block_store.h"

namespace kvtier::cache {

class StoreMetrics : public prometheus::Collectable {
 public:
  explicit StoreMetrics(BlockStore* store) : store_(store) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  BlockStore* store_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_STORE_METRICS_H_
