// A real Prometheus server (Debian's `prometheus`) scrapes kvtier-cache's
// /metrics; what it stored must equal what the Stats RPC reports.
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "services/base/child_process.h"
#include "services/cache/client/cache_client.h"
#include "services/kvblock/block_format.h"
#include "services/rpc/client_identity.h"
#include "tests/integration/prometheus_server.h"

namespace kvtier::cache {
namespace {

TEST(PrometheusScrape, ScrapedValuesMatchStats) {
  ChildProcess cache({KVTIER_CACHE_BINARY, "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                      "--device-capacity", "8MiB", "--host-capacity", "16MiB"});
  auto metrics = cache.WaitForLine("metrics on ");
  ASSERT_TRUE(metrics.has_value());
  const std::string metrics_address = metrics->substr(0, metrics->find('/'));
  const int port = cache.WaitForListeningPort();
  ASSERT_GT(port, 0);

  // Some traffic: blocks stored, read, demoted and missed.
  kvblock::LatentLayout layout;
  layout.model_id = "prometheus-test";
  layout.num_layers = 4;
  layout.kv_lora_rank = 512;
  layout.rope_dim = 64;
  layout.codec = kernels::Codec::kInt4;
  CacheClient client(MakeChannel("127.0.0.1:" + std::to_string(port)));
  std::vector<BlockSlices> blocks;
  std::vector<kvblock::BlockHash> hashes;
  for (uint32_t i = 0; i < 100; ++i) {
    std::vector<float> x(4 * layout.LayerShape().values(), static_cast<float>(i) - 3.5f);
    x[i % 64] = 100.0f;
    std::vector<uint32_t> tokens(64, i);
    BlockSlices b{kvblock::ChainHash("ns", kvblock::kNoParent, kvblock::LayoutId(layout), tokens),
                  {*kvblock::EncodeBlock(layout, 0, 4, x)}};
    hashes.push_back(b.hash);
    blocks.push_back(std::move(b));
  }
  ASSERT_TRUE(client.Put("ns", layout, blocks).ok());
  ASSERT_TRUE(client.Get("ns", layout, {hashes[0], hashes[99]}).ok());
  // The cache goes on demoting ahead of the next Put on a thread of its
  // own after this one returns: compare once its tiers have stopped moving.
  absl::StatusOr<v1::StatsResponse> stats = client.Stats();
  for (int tries = 0; stats.ok() && tries < 100; ++tries) {
    absl::SleepFor(absl::Milliseconds(50));
    absl::StatusOr<v1::StatsResponse> again = client.Stats();
    const bool settled = again.ok() && again->tiers(0).demotions() == stats->tiers(0).demotions() &&
                         again->tiers(1).blocks() == stats->tiers(1).blocks();
    stats = std::move(again);
    if (settled) break;
  }
  ASSERT_TRUE(stats.ok());

  testing::PrometheusServer prometheus({metrics_address});
  ASSERT_FALSE(prometheus.address().empty()) << "no free loopback port for Prometheus";

  struct Expect {
    std::string query;
    uint64_t value;
  };
  const std::vector<Expect> expects = {
      {"kvtier_cache_used_bytes{tier=\"device\"}", stats->tiers(0).used_bytes()},
      {"kvtier_cache_used_bytes{tier=\"host\"}", stats->tiers(1).used_bytes()},
      {"kvtier_cache_capacity_bytes{tier=\"device\"}", stats->tiers(0).capacity_bytes()},
      {"kvtier_cache_blocks{tier=\"host\"}", stats->tiers(1).blocks()},
      {"kvtier_cache_demotions_total{tier=\"device\"}", stats->tiers(0).demotions()},
      {"kvtier_cache_evictions_total{tier=\"host\"}", stats->tiers(1).evictions()},
      {"kvtier_cache_hits_total{tier=\"device\"}", stats->tiers(0).hits()},
      {"kvtier_cache_blocks_stored_total", stats->blocks_stored()},
      {"kvtier_cache_sent_bytes_total", stats->bytes_out()},
      {"kvtier_cache_received_bytes_total", stats->bytes_in()},
      {"kvtier_cache_misses_total", stats->misses()},
      {"kvtier_cache_checksum_failures_total{where=\"stored\"}", stats->checksum_failures()},
      {"kvtier_cache_checksum_failures_total{where=\"arrival\"}", stats->arrival_checksum_failures()},
      {"kvtier_cache_metadata_bytes", stats->metadata_bytes()},
  };
  EXPECT_GT(stats->tiers(0).demotions(), 0u) << "the traffic should have demoted blocks";
  for (const Expect& e : expects) {
    std::optional<double> scraped = prometheus.ValueOf(e.query);
    ASSERT_TRUE(scraped.has_value()) << e.query << " never scraped";
    EXPECT_EQ(*scraped, static_cast<double>(e.value)) << e.query;
  }
  // Adaptive eviction: 100 new blocks, none stored again: neither share has
  // moved, and the device tier's unread blocks are on probation.
  EXPECT_EQ(prometheus.ValueOf("kvtier_cache_probation_share"), std::optional<double>(1.0));
  EXPECT_EQ(prometheus.ValueOf("kvtier_cache_frequency_share"), std::optional<double>(0.0));
  std::optional<double> on_probation = prometheus.ValueOf("kvtier_cache_probation_bytes{tier=\"device\"}");
  ASSERT_TRUE(on_probation.has_value());
  EXPECT_GT(*on_probation, 0.0);
  EXPECT_LE(*on_probation, static_cast<double>(stats->tiers(0).used_bytes()));
  std::optional<double> puts =
      prometheus.ValueOf("kvtier_cache_rpc_duration_seconds_count{method=\"Put\",code=\"OK\"}");
  ASSERT_TRUE(puts.has_value());
  EXPECT_EQ(*puts, 1.0);
}

}  // namespace
}  // namespace kvtier::cache
