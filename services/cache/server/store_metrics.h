// Exposes the store's (and fast path's) counters to Prometheus, read from
// BlockStore::Stats at scrape time, so a scrape and a Stats RPC report the same figures.
#ifndef KVTIER_SERVICES_CACHE_SERVER_STORE_METRICS_H_
#define KVTIER_SERVICES_CACHE_SERVER_STORE_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <string>
#include <vector>

#include "services/cache/fast_path/fast_path_server.h"
#include "services/cache/store/block_store.h"

namespace kvtier::cache {

class StoreMetrics : public prometheus::Collectable {
 public:
  // `fast_path` may be null (its figures are then 0).
  explicit StoreMetrics(BlockStore* store, FastPathServer* fast_path = nullptr)
      : store_(store), fast_path_(fast_path) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  BlockStore* store_;
  FastPathServer* fast_path_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_STORE_METRICS_H_
