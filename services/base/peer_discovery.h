// Where a program's peers (cache shards, decode workers) are: a fixed list,
// or a DNS name whose SRV records name them, as Kubernetes publishes one
// record per ready pod of a headless Service. A name is looked up again
// every interval, so scaling a StatefulSet is all it takes to add or
// remove a peer.
#ifndef KVTIER_SERVICES_BASE_PEER_DISCOVERY_H_
#define KVTIER_SERVICES_BASE_PEER_DISCOVERY_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "services/base/dns_srv.h"
#include "services/base/log.h"

namespace kvtier {

// The prefix of a spec that names peers through DNS SRV records.
inline constexpr char kSrvPrefix[] = "srv:";

// "HOST:PORT[,HOST:PORT...]": each valid, none twice, at least one.
absl::StatusOr<std::vector<std::string>> ParseTargetList(const std::string& list);
// INVALID_ARGUMENT unless each target is a valid HOST:PORT and none is
// there twice.
absl::Status ValidateTargets(const std::vector<std::string>& targets);

class PeerDiscovery {
 public:
  struct Options {
    absl::Duration interval = absl::Seconds(10);
    std::string dns_server;  // "IPv4:PORT"; empty: the system's resolvers
    // The most targets a name may give; past it, those already known are
    // kept first, then the rest in sorted order.
    size_t max_targets = 256;
    // How many look-ups in a row must find no records before a name that
    // had targets is believed to have none: a name that flaps (NXDOMAIN
    // now and then) keeps its targets.
    int empty_answers_to_believe = 3;
  };
  // Called with the whole list of "HOST:PORT" targets, sorted.
  using OnChange = std::function<void(const std::vector<std::string>& targets)>;

  // `spec`: a target list (ParseTargetList), or "srv:NAME", a DNS name
  // (LookUpSrv) whose SRV records give the targets (host:port each).
  // Calls `on_change` once before returning; with a name, then again from
  // a thread of its own whenever the answer changes. A name that does not
  // resolve yet starts with no targets (logged), since its pods may not be
  // ready; a failed look-up keeps the last targets, and so do fewer than
  // empty_answers_to_believe empty answers in a row. Records whose target
  // is no valid HOST:PORT (port 0, a "." target) are skipped, and at most
  // max_targets are used; both logged. `what` names the peers
  // in logs ("cache shards"). INVALID_ARGUMENT for a bad spec, interval or
  // DNS server.
  static absl::StatusOr<std::unique_ptr<PeerDiscovery>> Start(std::string what, const std::string& spec,
                                                              Options options, OnChange on_change);
  // What Start would refuse `spec` and `options` for, found without a
  // look-up (for a program to check its flags before it loads anything).
  static absl::Status Validate(const std::string& spec, const Options& options);
  ~PeerDiscovery();

 private:
  PeerDiscovery(std::string what, std::string name, Options options, OnChange on_change);
  // One look-up, calling on_change if the targets changed (or on the
  // first); a failure is logged.
  void Refresh();

  const std::string what_;
  const std::string name_;  // empty for a fixed list
  const Options options_;
  const OnChange on_change_;
  // The answer's valid targets, sorted; at most max_targets, the known
  // ones first.
  std::vector<std::string> Choose(const std::vector<SrvRecord>& records);

  std::vector<std::string> current_;  // Refresh's alone: Start's, then the thread's
  bool first_ = true;
  int empty_answers_ = 0;                                     // in a row, while there were targets
  RateLimitedLog failures_{LogLevel::kWarning, "discovery"};  // a DNS outage says so once a minute
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_PEER_DISCOVERY_H_
