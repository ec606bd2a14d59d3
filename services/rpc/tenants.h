// Who may call a kvtier server, read from the tenants file (--tenants FILE,
// the schema and an example in proto/kvtier/v1/tenants.proto) and read
// again when it changes. A call proves its tenant with a bearer token
// (`authorization: Bearer TOKEN`, checked against the SHA-256 the file
// holds, in constant time) or with its mTLS client certificate (a subject
// alternative name or common name the file lists). Without a tenants file
// every caller is trusted as an admin (one trust domain), as before.
//
// A kvtier service (role SERVICE or ADMIN) calling for one of its end
// tenants names it in the call's kActingForMetadata: the call is then that
// tenant's, charged to it and held to its quota and role, in the
// namespaces both it and the service may use. Thread-safe.
#ifndef KVTIER_SERVICES_RPC_TENANTS_H_
#define KVTIER_SERVICES_RPC_TENANTS_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtier/v1/tenants.pb.h"
#include "services/base/watched_file.h"

namespace kvtier {

// The metadata in which a service names the end tenant it calls for.
inline constexpr char kActingForMetadata[] = "kvtier-acting-for";

// The tenant a call comes from.
struct Caller {
  std::string tenant;  // empty without a tenants file
  v1::TenantRole role = v1::ADMIN;
  absl::flat_hash_set<std::string> namespaces;  // unused for an admin
  std::string default_namespace = "default";    // the first listed, with a file
  v1::TenantQuota quota;
  std::string service;  // the service calling for it; empty when it calls itself
  // Which read of the tenants file it came from (TenantRegistry::Version).
  uint64_t file_version = 0;

  bool MayUse(const std::string& ns) const { return role == v1::ADMIN || namespaces.contains(ns); }
  bool MayWrite() const { return role != v1::READER; }
  // Whether the call's fast path session may stage Puts: a service's
  // session (SessionOwner) writes for many tenants.
  bool SessionOwnerMayWrite() const { return !service.empty() || MayWrite(); }
  bool IsService() const { return role == v1::SERVICE || role == v1::ADMIN; }
  // Who holds the call's connections, fast path sessions and leases: the
  // service when it acts for the tenant.
  const std::string& SessionOwner() const { return service.empty() ? tenant : service; }
  // The end tenant a service names when it calls on this caller's behalf
  // (kActingForMetadata): none when the caller is a service itself (or
  // there are no tenants).
  std::string ActingFor() const { return IsService() ? "" : tenant; }
  // Who it is, for logs ("tenant acme" or "the one trust domain").
  std::string Describe() const;
};

// PERMISSION_DENIED naming the tenant and namespace unless it may use it.
absl::Status CheckNamespace(const Caller& caller, const std::string& ns);

// The tenants in `json` (a TenantsFile), checked: names unique and set, a
// role, a proof each, tokens as 64 lowercase hex digits, namespaces for
// all but admins. INVALID_ARGUMENT saying what is wrong.
absl::StatusOr<v1::TenantsFile> ParseTenantsFile(const std::string& json);

class TenantRegistry {
 public:
  // Reads `path`, then checks it for changes every `reload` on a thread
  // of its own; empty `path`: no tenants file (one trust domain, which
  // ServerRunner warns of once serving). INVALID_ARGUMENT when the file
  // cannot be read or parsed.
  static absl::StatusOr<std::unique_ptr<TenantRegistry>> Open(const std::string& path, absl::Duration reload);
  ~TenantRegistry();
  TenantRegistry(const TenantRegistry&) = delete;
  TenantRegistry& operator=(const TenantRegistry&) = delete;

  bool enforced() const { return !path_.empty(); }
  // Which read of the file calls are checked against now: 0 for the
  // first, one more for each changed file a reload takes. A call that
  // outlives reloads (a stream) is authenticated again when it moves;
  // asked at each of its messages, so no lock.
  uint64_t Version() const;
  // Each tenant as the file says now (its name, role, namespaces and
  // quota); none without a tenants file.
  using TenantList = std::vector<std::shared_ptr<const Caller>>;
  TenantList Tenants();

  // Who may read `ns`, as a key: the tenants (admins aside, who read every
  // namespace) whose namespaces include it, as the file says now; one key
  // for all without a tenants file. Namespaces with one key may share
  // shared-memory segments (the cache's fast path): whoever may map one of
  // them may read them all.
  std::string ReaderClass(const std::string& ns);
  // Whether `tenant` may read `ns` as the file says now (anyone may without
  // a tenants file): for a right checked once and used later, such as the
  // namespaces whose segments a fast path session may map.
  bool MayRead(const std::string& tenant, const std::string& ns);

  // The caller of a call; UNAUTHENTICATED when it brings no proof or a bad
  // one (logged, rate-limited, with the peer and `method`; no secret). A
  // call naming a tenant in kActingForMetadata is that tenant's when its
  // proven caller is a service; PERMISSION_DENIED when it is not, or the
  // tenant is unknown or a service or admin itself. Without a tenants
  // file the metadata is ignored.
  absl::StatusOr<std::shared_ptr<const Caller>> Authenticate(const grpc::ServerContextBase& context,
                                                             const char* method);

  // Calls `hook` with the tenants of each changed file a reload takes (on
  // the watcher's thread), before calls see that file; nullptr stops it.
  // Once this returns, the hook it replaces is not running and will not
  // run again.
  void OnReload(std::function<void(const TenantList&)> hook);

  // Reads the file again now if it changed (the thread's job; for tests).
  void ReloadIfChanged();

 private:
  struct Loaded;
  TenantRegistry(std::string path, absl::Duration reload, std::shared_ptr<const Loaded> loaded, std::string signature);
  std::shared_ptr<const Loaded> Current();
  // The tenant whose proof the call brings, as Authenticate says.
  static absl::StatusOr<std::shared_ptr<const Caller>> Prove(const Loaded& loaded,
                                                             const grpc::ServerContextBase& context,
                                                             const char* method);

  static constexpr size_t kMostRememberedClasses = 1 << 16;

  const std::string path_;
  absl::Mutex mu_;
  std::shared_ptr<const Loaded> loaded_ ABSL_GUARDED_BY(mu_);
  std::string signature_ ABSL_GUARDED_BY(mu_);  // the file's inode, size and mtime when read
  std::atomic<uint64_t> version_{0};            // loaded_'s, set with it
  absl::Mutex hook_mu_;                         // held while the hook runs
  std::function<void(const TenantList&)> on_reload_ ABSL_GUARDED_BY(hook_mu_);
  std::unique_ptr<PeriodicTask> watcher_;  // last: stops first
};

// registry->Authenticate, or with no registry the caller of one trust
// domain.
absl::StatusOr<std::shared_ptr<const Caller>> Authenticate(TenantRegistry* registry,
                                                           const grpc::ServerContextBase& context, const char* method);

}  // namespace kvtier

#endif  // KVTIER_SERVICES_RPC_TENANTS_H_
