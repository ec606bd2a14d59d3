// The cache's Stats as the table `kvtier stats` prints (also `kvtier up`).
#ifndef KVTIER_SERVICES_CLI_STATS_TABLE_H_
#define KVTIER_SERVICES_CLI_STATS_TABLE_H_

#include <string>

#include "kvtier/v1/cache.pb.h"

namespace kvtier::cli {

std::string StatsTable(const std::string& target, const v1::StatsResponse& stats);

}  // namespace kvtier::cli

#endif  // KVTIER_SERVICES_CLI_STATS_TABLE_H_
