// A real Prometheus server (Debian's `prometheus`) scrapes kvtier-cache's
// /metrics; what it stored must equal what the Stats RPC reports.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <thread>

#include "services/cache/client/cache_client.h"
#include "services/common/child_process.h"
#include "services/kvblock/block_format.h"
#include "tests/eventually.h"

namespace kvtier::cache {
namespace {

// Asks Prometheus's HTTP API for one instant value, again and again
// (Prometheus announces nothing) until the series exists or 30 s pass.
std::optional<double> QueryUntilPresent(const std::string& prometheus, const std::string& query) {
  const std::regex value(R"re("value":\[[0-9.]+,"([0-9.eE+-]+)"\])re");
  std::optional<double> found;
  testing::Eventually(
      [&] {
        auto r = RunCommand("curl -sfG http://" + prometheus + "/api/v1/query --data-urlencode 'query=" + query + "'");
        std::smatch m;
        if (r.exit_code == 0 && std::regex_search(r.output, m, value)) found = std::stod(m[1]);
        return found.has_value();
      },
      std::chrono::seconds(30));
  return found;
}

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
  CacheClient client(CacheClient::Connect("127.0.0.1:" + std::to_string(port)));
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
  auto stats = client.Stats();
  ASSERT_TRUE(stats.ok());

  const auto dir = std::filesystem::temp_directory_path() / ("kvtier_prometheus_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream config(dir / "prometheus.yml");
    config << "global:\n  scrape_interval: 250ms\n  scrape_timeout: 200ms\n"
           << "scrape_configs:\n  - job_name: kvtier-cache\n    static_configs:\n"
           << "      - targets: ['" << metrics_address << "']\n";
  }
  const int prometheus_port = FreeLoopbackPort();
  ASSERT_GT(prometheus_port, 0) << "no free loopback port for Prometheus";
  const std::string prometheus = "127.0.0.1:" + std::to_string(prometheus_port);
  ChildProcess server({"/usr/bin/prometheus", "--config.file=" + (dir / "prometheus.yml").string(),
                       "--storage.tsdb.path=" + (dir / "data").string(), "--web.listen-address=" + prometheus,
                       "--log.level=warn"});

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
      {"kvtier_cache_checksum_failures_total", stats->checksum_failures()},
      {"kvtier_cache_metadata_bytes", stats->metadata_bytes()},
  };
  EXPECT_GT(stats->tiers(0).demotions(), 0u) << "the traffic should have demoted blocks";
  for (const Expect& e : expects) {
    std::optional<double> scraped = QueryUntilPresent(prometheus, e.query);
    ASSERT_TRUE(scraped.has_value()) << e.query << " never scraped";
    EXPECT_EQ(*scraped, static_cast<double>(e.value)) << e.query;
  }
  std::optional<double> puts =
      QueryUntilPresent(prometheus, "kvtier_cache_rpc_duration_seconds_count{method=\"Put\",code=\"OK\"}");
  ASSERT_TRUE(puts.has_value());
  EXPECT_EQ(*puts, 1.0);
  server.Stop(SIGTERM);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvtier::cache
