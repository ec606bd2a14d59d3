#include "services/base/peer_discovery.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "services/base/address.h"
#include "services/base/dns_srv.h"
#include "services/base/log.h"
#include "services/base/status.h"

namespace kvtier {
namespace {

// "added a, b; removed c", or "" when nothing changed.
std::string Difference(const std::vector<std::string>& before, const std::vector<std::string>& after) {
  std::vector<std::string> added, removed;
  std::set_difference(after.begin(), after.end(), before.begin(), before.end(), std::back_inserter(added));
  std::set_difference(before.begin(), before.end(), after.begin(), after.end(), std::back_inserter(removed));
  std::vector<std::string> parts;
  if (!added.empty()) parts.push_back("added " + absl::StrJoin(added, ", "));
  if (!removed.empty()) parts.push_back("removed " + absl::StrJoin(removed, ", "));
  return absl::StrJoin(parts, "; ");
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseTargetList(const std::string& list) {
  std::vector<std::string> targets;
  for (absl::string_view t : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    targets.emplace_back(absl::StripAsciiWhitespace(t));
  }
  if (targets.empty()) return absl::InvalidArgumentError("no HOST:PORT given");
  KVTIER_RETURN_IF_ERROR(ValidateTargets(targets));
  return targets;
}

absl::Status ValidateTargets(const std::vector<std::string>& targets) {
  std::set<std::string> seen;
  for (const std::string& target : targets) {
    KVTIER_RETURN_IF_ERROR(ValidateTargetAddress(target));
    if (!seen.insert(target).second) return absl::InvalidArgumentError(absl::StrCat(target, " is listed twice"));
  }
  return absl::OkStatus();
}

absl::Status PeerDiscovery::Validate(const std::string& spec, const Options& options) {
  if (!absl::StartsWith(spec, kSrvPrefix)) return ParseTargetList(spec).status();
  const std::string name = spec.substr(std::string(kSrvPrefix).size());
  if (name.empty() || absl::StrContains(name, ':') || absl::StrContains(name, ',')) {
    return absl::InvalidArgumentError(absl::StrCat("'", spec, "' is not srv:NAME (a DNS name, no port)"));
  }
  if (options.interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the look-up interval must be positive");
  }
  return ValidateDnsServer(options.dns_server);
}

absl::StatusOr<std::unique_ptr<PeerDiscovery>> PeerDiscovery::Start(std::string what, const std::string& spec,
                                                                    Options options, OnChange on_change) {
  KVTIER_RETURN_IF_ERROR(Validate(spec, options));
  if (!absl::StartsWith(spec, kSrvPrefix)) {
    std::vector<std::string> targets = *ParseTargetList(spec);
    std::sort(targets.begin(), targets.end());
    on_change(targets);
    return std::unique_ptr<PeerDiscovery>(new PeerDiscovery(std::move(what), "", options, nullptr));
  }
  auto discovery = std::unique_ptr<PeerDiscovery>(
      new PeerDiscovery(std::move(what), spec.substr(std::string(kSrvPrefix).size()), options, std::move(on_change)));
  discovery->Refresh();
  PeerDiscovery* d = discovery.get();
  discovery->thread_ = std::thread([d] {
    while (!d->stop_.WaitForNotificationWithTimeout(d->options_.interval)) d->Refresh();
  });
  return discovery;
}

PeerDiscovery::PeerDiscovery(std::string what, std::string name, Options options, OnChange on_change)
    : what_(std::move(what)), name_(std::move(name)), options_(std::move(options)), on_change_(std::move(on_change)) {}

PeerDiscovery::~PeerDiscovery() {
  stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void PeerDiscovery::Refresh() {
  absl::StatusOr<std::vector<SrvRecord>> records = LookUpSrv(name_, options_.dns_server);
  if (!records.ok()) {
    failures_(absl::StrCat(records.status().message(), "; keeping the ", current_.size(), " ", what_, " known"));
    if (first_) on_change_(current_);
    first_ = false;
    return;
  }
  std::vector<std::string> targets = Choose(*records);
  if (targets.empty() && !current_.empty() && ++empty_answers_ < options_.empty_answers_to_believe) {
    failures_(absl::StrCat("srv:", name_, " has no records (", empty_answers_, " look-up(s) in a row); keeping the ",
                           current_.size(), " ", what_, " known"));
    return;
  }
  empty_answers_ = 0;
  if (!first_ && targets == current_) return;
  const std::string change = Difference(current_, targets);
  Log(targets.empty() ? LogLevel::kWarning : LogLevel::kInfo, "discovery",
      absl::StrCat(what_, " from srv:", name_, ": ", targets.empty() ? "none" : absl::StrJoin(targets, ", "),
                   change.empty() ? "" : absl::StrCat(" (", change, ")")));
  current_ = std::move(targets);
  first_ = false;
  on_change_(current_);
}

std::vector<std::string> PeerDiscovery::Choose(const std::vector<SrvRecord>& records) {
  std::vector<std::string> valid;
  std::vector<std::string> refused;
  for (const SrvRecord& r : records) {
    std::string target = absl::StrCat(r.host, ":", r.port);
    (ValidateTargetAddress(target).ok() && r.host != "." && !r.host.empty() ? valid : refused)
        .push_back(std::move(target));
  }
  if (!refused.empty()) {
    failures_(absl::StrCat("srv:", name_, ": skipped ", refused.size(), " record(s) that name no HOST:PORT, e.g. '",
                           absl::CEscape(refused[0]), "'"));
  }
  std::sort(valid.begin(), valid.end());
  valid.erase(std::unique(valid.begin(), valid.end()), valid.end());
  if (valid.size() <= options_.max_targets) return valid;
  // Too many: the known ones stay (a flood of new records cannot push out
  // the peers in use), then the rest in order.
  std::vector<std::string> chosen;
  std::set_intersection(valid.begin(), valid.end(), current_.begin(), current_.end(), std::back_inserter(chosen));
  if (chosen.size() > options_.max_targets) chosen.resize(options_.max_targets);
  for (const std::string& t : valid) {
    if (chosen.size() >= options_.max_targets) break;
    if (!std::binary_search(current_.begin(), current_.end(), t)) chosen.push_back(t);
  }
  std::sort(chosen.begin(), chosen.end());
  failures_(absl::StrCat("srv:", name_, " lists ", valid.size(), " ", what_, "; using ", chosen.size(), " (at most ",
                         options_.max_targets, ")"));
  return chosen;
}

}  // namespace kvtier
