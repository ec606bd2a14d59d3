#include "services/cache/server/store_metrics.h"

#include <array>
#include <map>
#include <string>

#include "services/server/metric_family.h"

namespace kvtier::cache {

using prometheus::MetricFamily;
using prometheus::MetricType;

std::vector<MetricFamily> StoreMetrics::Collect() const {
  const StoreStats s = store_->Stats();
  const FastPathCounters fast = fast_path_ != nullptr ? fast_path_->Counters() : FastPathCounters();
  struct PerTier {
    const char* name;
    const char* help;
    MetricType type;
    uint64_t TierCounters::*field;
  };
  const PerTier per_tier[] = {
      {"kvtier_cache_capacity_bytes", "Hard limit on block bytes in the tier", MetricType::Gauge,
       &TierCounters::capacity_bytes},
      {"kvtier_cache_used_bytes", "Memory the tier's blocks take, whole pages (stored and being assembled)",
       MetricType::Gauge, &TierCounters::used_bytes},
      {"kvtier_cache_blocks", "Visible blocks held in the tier", MetricType::Gauge, &TierCounters::blocks},
      {"kvtier_cache_hits_total", "Blocks read from the tier", MetricType::Counter, &TierCounters::hits},
      {"kvtier_cache_promotions_total", "Blocks moved into the tier from a slower one on read", MetricType::Counter,
       &TierCounters::promotions},
      {"kvtier_cache_demotions_total", "Blocks moved out of the tier to a slower one when full", MetricType::Counter,
       &TierCounters::demotions},
      {"kvtier_cache_demotions_ahead_total",
       "Of the demotions, those made on the store's own thread to keep room free ahead of Puts (the rest made a Put "
       "wait)",
       MetricType::Counter, &TierCounters::demotions_ahead},
      {"kvtier_cache_evictions_total", "Blocks dropped from the tier with no slower tier to take them",
       MetricType::Counter, &TierCounters::evictions},
      {"kvtier_cache_write_errors_total",
       "Records the tier could not store: its storage full before its capacity (a disk's), or failing",
       MetricType::Counter, &TierCounters::write_errors},
      {"kvtier_cache_segment_slack_bytes",
       "Free bytes in shared segments that hold a tenant's blocks of a group of namespaces: only those can use "
       "them",
       MetricType::Gauge, &TierCounters::segment_slack_bytes},
      {"kvtier_cache_probation_bytes",
       "Memory the tier's blocks stored and not used since take (adaptive eviction gives them up first past "
       "their share)",
       MetricType::Gauge, &TierCounters::probation_bytes},
  };
  std::vector<MetricFamily> families;
  for (const PerTier& p : per_tier) {
    MetricFamily f = Family(p.name, p.help, p.type);
    for (const TierCounters& t : s.tiers) {
      AddSample(f, static_cast<double>(t.*(p.field)), {{"tier", kvblock::TierName(static_cast<v1::Tier>(t.tier))}});
    }
    families.push_back(std::move(f));
  }
  struct Single {
    const char* name;
    const char* help;
    MetricType type;
    uint64_t value;
  };
  const Single singles[] = {
      {"kvtier_cache_misses_total", "Block reads that found nothing", MetricType::Counter, s.misses},
      {"kvtier_cache_blocks_stored_total", "Blocks that became visible", MetricType::Counter, s.blocks_stored},
      {"kvtier_cache_blocks_stored_cold_start_total",
       "Blocks that became visible from Puts marked cold_start (the client found under a quarter of the prefix)",
       MetricType::Counter, s.blocks_stored_cold_start},
      {"kvtier_cache_blocks_deduplicated_total", "Puts of blocks already stored", MetricType::Counter,
       s.blocks_deduplicated},
      {"kvtier_cache_received_bytes_total", "Slice record bytes accepted by Put", MetricType::Counter, s.bytes_in},
      {"kvtier_cache_sent_bytes_total", "Block record bytes served by Get", MetricType::Counter, s.bytes_out},
      {"kvtier_cache_metadata_bytes", "Memory outside the tiers' block bytes: bookkeeping, memfds made ahead",
       MetricType::Gauge, s.metadata_bytes},
      {"kvtier_cache_leases", "Leases pinning blocks now", MetricType::Gauge, s.active_leases},
      {"kvtier_cache_pending_blocks", "Blocks being assembled by Put streams", MetricType::Gauge, s.pending_blocks},
      {"kvtier_cache_pinned_blocks", "Blocks pinned by leases or readers", MetricType::Gauge, s.pinned_blocks},
      {"kvtier_cache_fast_path_sessions", "Same-host fast path sessions open and proven", MetricType::Gauge,
       fast.sessions},
      {"kvtier_cache_fast_path_blocks_total", "Blocks handed out as shared-memory leases", MetricType::Counter,
       fast.blocks_out},
      {"kvtier_cache_fast_path_sent_bytes_total", "Record bytes handed out as shared-memory leases",
       MetricType::Counter, fast.bytes_out},
      {"kvtier_cache_fast_path_received_bytes_total", "Slice record bytes Put took from staging regions",
       MetricType::Counter, fast.bytes_in},
      {"kvtier_cache_fast_path_staging_bytes", "Staging regions granted to open fast path sessions", MetricType::Gauge,
       fast.staging_bytes},
      {"kvtier_cache_fast_path_device_staging_bytes", "GPU memory granted to open fast path sessions",
       MetricType::Gauge, fast.device_staging_bytes},
  };
  for (const Single& single : singles) {
    MetricFamily f = Family(single.name, single.help, single.type);
    AddSample(f, static_cast<double>(single.value));
    families.push_back(std::move(f));
  }
  // Adaptive eviction's shares, learned from what comes back.
  const auto share = [&](const char* name, const char* help, double value) {
    MetricFamily f = Family(name, help, MetricType::Gauge);
    AddSample(f, value);
    families.push_back(std::move(f));
  };
  share("kvtier_cache_probation_share",
        "Adaptive eviction: of each tier, what blocks stored and not used since may take before they go first (1: "
        "leaf-first LRU)",
        s.probation_share);
  share("kvtier_cache_frequency_share",
        "Adaptive eviction: of the victims where recency's and frequency's differ, what share goes by frequency (0: "
        "leaf-first LRU)",
        s.frequency_share);
  // Stored records going bad point at memory or disk; slices arriving bad,
  // at the sender.
  MetricFamily checksums = Family("kvtier_cache_checksum_failures_total",
                                  "Records whose CRC32C failed: stored ones (on a read, a tier move or recovery), or "
                                  "slices as Put received them",
                                  MetricType::Counter);
  AddSample(checksums, static_cast<double>(s.checksum_failures), {{"where", "stored"}});
  AddSample(checksums, static_cast<double>(s.arrival_checksum_failures), {{"where", "arrival"}});
  families.push_back(std::move(checksums));
  // Per tenant (the tenants file's names; nothing without one) and tier;
  // no sample for a 0 where `zero_is_none`.
  const auto per_tenant_and_tier =
      [&s](MetricFamily& family, const std::map<std::string, std::array<uint64_t, 3>>& by_tenant, bool zero_is_none) {
        for (const auto& [tenant, bytes] : by_tenant) {
          for (size_t i = 0; i < s.tiers.size(); ++i) {
            if (tenant.empty() || (zero_is_none && bytes[i] == 0)) continue;
            AddSample(family, static_cast<double>(bytes[i]),
                      {{"tenant", tenant}, {"tier", kvblock::TierName(static_cast<v1::Tier>(s.tiers[i].tier))}});
          }
        }
      };
  MetricFamily used =
      Family("kvtier_cache_tenant_used_bytes",
             "Memory a tenant's blocks take in the tier: pages or slots, and 256 bytes a block of bookkeeping",
             MetricType::Gauge);
  per_tenant_and_tier(used, s.used_by_owner, /*zero_is_none=*/false);
  families.push_back(std::move(used));
  MetricFamily quota = Family("kvtier_cache_tenant_quota_bytes",
                              "The quota a tenant's blocks are held to in the tier (tenants that hold blocks, in the "
                              "tiers where they have one): the tenants file's when last read",
                              MetricType::Gauge);
  per_tenant_and_tier(quota, s.quota_by_owner, /*zero_is_none=*/true);
  families.push_back(std::move(quota));
  MetricFamily evicted =
      Family("kvtier_cache_tenant_evictions_total", "A tenant's blocks dropped to make room", MetricType::Counter);
  for (const auto& [tenant, count] : s.evictions_by_owner) {
    if (!tenant.empty()) AddSample(evicted, static_cast<double>(count), {{"tenant", tenant}});
  }
  families.push_back(std::move(evicted));
  return families;
}

}  // namespace kvtier::cache
