// `kvtier stats --target ADDR [--json]`: a cache server's capacity, use and
// counters, for a person or (with --json) for tools.
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "services/base/flags.h"
#include "services/cache/client/cache_client.h"
#include "services/cli/commands.h"
#include "services/cli/stats_table.h"
#include "services/rpc/client_identity.h"
#include "services/rpc/security_flags.h"

namespace kvtier::cli {
namespace {

std::string HumanBytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.1f %s", v, units[u]);
}

void PrintJson(const v1::StatsResponse& s) {
  std::string out = absl::StrCat("{\"server_version\": \"", s.server_version(), "\", \"tiers\": [");
  for (int i = 0; i < s.tiers_size(); ++i) {
    const v1::TierStats& t = s.tiers(i);
    absl::StrAppend(&out, i ? ", " : "", "{\"tier\": \"", kvblock::TierName(t.tier()),
                    "\", \"capacity_bytes\": ", t.capacity_bytes(), ", \"used_bytes\": ", t.used_bytes(),
                    ", \"blocks\": ", t.blocks(), ", \"hits\": ", t.hits(), ", \"promotions\": ", t.promotions(),
                    ", \"demotions\": ", t.demotions(), ", \"evictions\": ", t.evictions(),
                    ", \"write_errors\": ", t.write_errors(), "}");
  }
  absl::StrAppend(
      &out, "], \"metadata_bytes\": ", s.metadata_bytes(), ", \"misses\": ", s.misses(),
      ", \"blocks_stored\": ", s.blocks_stored(), ", \"blocks_deduplicated\": ", s.blocks_deduplicated(),
      ", \"bytes_in\": ", s.bytes_in(), ", \"bytes_out\": ", s.bytes_out(),
      ", \"checksum_failures\": ", s.checksum_failures(),
      ", \"arrival_checksum_failures\": ", s.arrival_checksum_failures(), ", \"active_leases\": ", s.active_leases(),
      ", \"pending_blocks\": ", s.pending_blocks(), ", \"pinned_blocks\": ", s.pinned_blocks(),
      ", \"fast_path_sessions\": ", s.fast_path_sessions(), ", \"fast_path_blocks_out\": ", s.fast_path_blocks_out(),
      ", \"fast_path_bytes_out\": ", s.fast_path_bytes_out(), ", \"fast_path_bytes_in\": ", s.fast_path_bytes_in(),
      ", \"fast_path_staging_bytes\": ", s.fast_path_staging_bytes(), "}");
  std::cout << out << "\n";
}

}  // namespace

std::string StatsTable(const std::string& target, const v1::StatsResponse& s) {
  std::string out = absl::StrCat(s.server_version(), " at ", target, "\n\n");
  absl::StrAppend(&out, absl::StrFormat("%-7s %12s %12s %6s %8s %8s %10s %10s %10s\n", "tier", "capacity", "used",
                                        "use", "blocks", "hits", "promoted", "demoted", "evicted"));
  for (const v1::TierStats& t : s.tiers()) {
    const double use = t.capacity_bytes() ? 100.0 * t.used_bytes() / t.capacity_bytes() : 0;
    absl::StrAppend(
        &out, absl::StrFormat("%-7s %12s %12s %5.1f%% %8d %8d %10d %10d %10d\n", kvblock::TierName(t.tier()),
                              HumanBytes(t.capacity_bytes()), HumanBytes(t.used_bytes()), use, t.blocks(), t.hits(),
                              t.promotions(), t.demotions(), t.evictions()));
  }
  uint64_t write_errors = 0;
  for (const v1::TierStats& t : s.tiers()) write_errors += t.write_errors();
  absl::StrAppend(&out, "\nmisses ", s.misses(), ", blocks stored ", s.blocks_stored(), ", deduplicated ",
                  s.blocks_deduplicated(), ", in ", HumanBytes(s.bytes_in()), ", out ", HumanBytes(s.bytes_out()),
                  ", checksum failures ", s.checksum_failures(), " stored and ", s.arrival_checksum_failures(),
                  " arriving, write errors ", write_errors, ", leases ", s.active_leases(), ", metadata ",
                  HumanBytes(s.metadata_bytes()), "\n");
  absl::StrAppend(&out, "same-host fast path: ", s.fast_path_sessions(), " sessions, ", s.fast_path_blocks_out(),
                  " blocks (", HumanBytes(s.fast_path_bytes_out()), ") out, ", HumanBytes(s.fast_path_bytes_in()),
                  " in, staging ", HumanBytes(s.fast_path_staging_bytes()), "\n");
  return out;
}

int RunStats(const std::vector<std::string>& args) {
  std::string target;
  bool json = false;
  uint64_t timeout_ms = 5000;
  FlagParser flags("kvtier stats --target HOST:PORT [--json]",
                   "Prints a kvtier-cache server's capacity, use, blocks and counters per tier.");
  flags.AddString("target", &target, "the cache server's gRPC address");
  flags.AddBool("json", &json, "print one JSON object instead of a table");
  flags.AddUint("timeout-ms", &timeout_ms, "deadline of the Stats call");
  SecurityFlags security;
  security.Register(flags, /*serves=*/false, /*calls=*/true);
  if (std::optional<int> exit = flags.ParseOrExit(args, "kvtier stats")) return *exit;
  if (absl::Status s = security.ApplyToClients(); !s.ok()) {
    std::cerr << "kvtier stats: " << s.message() << "\n";
    return 2;
  }
  if (target.empty()) {
    std::cerr << "kvtier stats: --target is required\n";
    return 2;
  }
  cache::CacheClient client(MakeChannel(target), absl::Milliseconds(static_cast<int64_t>(timeout_ms)));
  absl::StatusOr<v1::StatsResponse> stats = client.Stats();
  if (!stats.ok()) {
    std::cerr << "kvtier stats: " << target << ": " << stats.status() << ConnectionHint(stats.status()) << "\n";
    return 1;
  }
  if (json) {
    PrintJson(*stats);
  } else {
    std::cout << StatsTable(target, *stats);
  }
  return 0;
}

}  // namespace kvtier::cli
