// The cache's side of the same-host fast path (fast_path.md): sessions that
// prove they are local over a unix socket, read-only segment descriptors
// handed to them for the namespaces they read, and leases that pin the
// blocks whose shared-memory locations they were given.
//
// A session's leases end when it releases them, at their deadline, or at
// once when its socket closes (the client died). One thread serves the
// socket and expires leases; the RPC side calls in from any thread.
// Thread-safe; lock order: FastPathServer::mu_, then BlockStore's.
#ifndef KVTIER_SERVICES_CACHE_FAST_PATH_FAST_PATH_SERVER_H_
#define KVTIER_SERVICES_CACHE_FAST_PATH_FAST_PATH_SERVER_H_

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtier/v1/cache.pb.h"
#include "services/base/clock.h"
#include "services/cache/store/block_store.h"
#include "services/rpc/peer_trust.h"
#include "services/rpc/tenants.h"

namespace kvtier::cache {

struct FastPathOptions {
  std::string socket_path;  // '@name': Linux abstract namespace
  // Whether a tenant may read a namespace now (TenantRegistry::MayRead):
  // a session maps segments only of namespaces it leased blocks of for a
  // tenant that still may. Null: any tenant may.
  std::function<bool(const std::string& tenant, const std::string& ns)> may_read;
  // The trust the gRPC server puts in client certificates now
  // (TlsFiles::trust); null: none is checked (plaintext). A session keeps
  // the certificate chain its client presented when it opened and ends
  // once the chain no longer verifies (revoked, its CA dropped, expired):
  // checked again whenever the trust changes and when it falls due.
  std::function<std::shared_ptr<const PeerTrust>()> trust;
  absl::Duration prove_within = absl::Seconds(10);
  size_t max_sessions = 256;
  size_t max_sessions_per_tenant = 32;  // unless its quota says otherwise
  // Connections that have not proven a session yet, per peer uid. Past it,
  // or past twice max_sessions connections in all, the oldest unproven
  // connection (of that uid, else anyone's) is closed to make room.
  size_t max_unproven_per_uid = 32;
  size_t max_leases_per_session = 1024;
  absl::Duration default_lease_ttl = absl::Seconds(30);
  absl::Duration max_lease_ttl = absl::Minutes(1);
  // Staging regions for staged Put: all sessions' together, and one's most.
  uint64_t staging_budget = 512 << 20;
  uint64_t max_staging_per_session = 128 << 20;
  // Device staging (GPU device tier only): all sessions' together, and
  // one's most.
  uint64_t device_staging_budget = uint64_t{1} << 30;
  uint64_t max_device_staging = 256 << 20;
};

struct FastPathCounters {
  uint64_t sessions = 0;  // proven and open
  uint64_t blocks_out = 0;
  uint64_t bytes_out = 0;
  uint64_t bytes_in = 0;              // staged slice bytes taken by Put
  uint64_t staging_bytes = 0;         // granted to open sessions
  uint64_t device_staging_bytes = 0;  // GPU memory granted to open sessions
};

// A session's staging region: a sealed memfd the client writes records
// into and Put streams read them from. Lives while its session or a Put
// stream using it does.
class StagingRegion {
 public:
  static absl::StatusOr<std::shared_ptr<StagingRegion>> Create(uint64_t bytes);
  ~StagingRegion();
  StagingRegion(const StagingRegion&) = delete;
  StagingRegion& operator=(const StagingRegion&) = delete;

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }
  // [offset, offset + length), or INVALID_ARGUMENT if it is not inside.
  absl::StatusOr<std::string_view> Range(uint64_t offset, uint64_t length) const;

 private:
  StagingRegion(int fd, const char* base, uint64_t size) : fd_(fd), base_(base), size_(size) {}
  int fd_;
  const char* base_;
  uint64_t size_;
};

// Fast-path lease ids have this bit set; Match's never do.
inline constexpr uint64_t kFastPathLeaseBit = uint64_t{1} << 63;

class FastPathServer {
 public:
  // Listens on options.socket_path; `store` and `clock` must outlive it.
  static absl::StatusOr<std::unique_ptr<FastPathServer>> Start(const FastPathOptions& options, BlockStore* store,
                                                               Clock* clock);
  // Stops listening, closes every connection and ends every lease (their
  // blocks unpinned); its counters stay readable. Once; the destructor
  // stops it too.
  void Stop();
  ~FastPathServer();

  const std::string& socket_path() const { return options_.socket_path; }

  // A new, unproven session, offered a staging region of up to
  // request.staging_bytes() and device staging of up to
  // request.device_staging_bytes() (when the device tier is a GPU's), each
  // granted when it proves itself, as far as its budget allows then.
  // FAILED_PRECONDITION for a client whose host_boot_id says it is on
  // another host; RESOURCE_EXHAUSTED at max_sessions.
  // The session is the caller's tenant's: only that tenant's calls may use
  // it (to any other tenant it is unknown); RESOURCE_EXHAUSTED when the
  // tenant holds max_sessions_per_tenant (or its quota's) already.
  // `peer_chain`: the certificate chain the caller's connection presented
  // (PEM, empty for none); UNAUTHENTICATED when the trust in force no
  // longer verifies it (its connection predates the change).
  absl::StatusOr<v1::OpenFastPathResponse> Open(const v1::OpenFastPathRequest& request, const Caller& caller,
                                                const std::string& peer_chain = "");
  absl::StatusOr<v1::OpenFastPathResponse> Open(const v1::OpenFastPathRequest& request) {
    return Open(request, Caller());
  }
  // A proven session's staging region; FAILED_PRECONDITION if it has none
  // or is another tenant's.
  absl::StatusOr<std::shared_ptr<const StagingRegion>> Staging(uint64_t session_id, const std::string& tenant = "");
  // Counts bytes a Put stream took from a staging region.
  void CountStaged(uint64_t bytes);
  // Pins `hashes` (checked by the caller) of `ns` for a proven session and
  // fills `response` with where their records lie. FAILED_PRECONDITION for
  // an unknown or unproven session, or one not `caller`'s (its
  // SessionOwner's).
  absl::Status Lease(uint64_t session_id, const std::string& ns, uint64_t layout_id,
                     const std::vector<kvblock::BlockHash>& hashes, absl::Duration ttl,
                     v1::LeaseBlocksResponse& response, const Caller& caller = Caller());
  // Ends a fast-path lease; NOT_FOUND if unknown, expired or another
  // tenant's.
  absl::Status Release(uint64_t lease_id, const std::string& tenant = "");
  // The tenants that may hold sessions from now on, with their roles (a
  // tenants file's, at each reload; until called, any): on the loop's next
  // turn the sessions of every other end (their connections closed, leases
  // ended and staging freed), and so do those of a tenant whose right to
  // write changed (a new session gets staging as its tenant may write now),
  // and a tenant's newest sessions beyond the most its quota now lets it
  // hold; Open refuses the others. Returns why each tenant's sessions end,
  // one line each ("tenant NAME is no longer in the file: its fast path
  // sessions end").
  std::vector<std::string> KeepTenants(const TenantRegistry::TenantList& tenants);
  FastPathCounters Counters();
  // Waits until `sessions` proven sessions are open, at most `timeout`;
  // whether they are (for tests: a session ends on the socket's thread).
  bool AwaitSessions(uint64_t sessions, absl::Duration timeout);

 private:
  // A session's device staging buffer and the ranges leases hold in it.
  struct DeviceStaging {
    std::unique_ptr<ExportedBuffer> buffer;
    std::map<uint64_t, uint64_t> used;  // offset -> size
    // First fit; nullopt when nothing fits.
    std::optional<uint64_t> Allocate(uint64_t size);
  };
  struct Session {
    std::string tenant;  // whose calls may use it
    std::array<uint8_t, 16> secret;
    absl::Time open_until;  // unproven sessions are dropped after it
    int socket = -1;        // the proving connection; -1 until proven
    // Read through this session so far, each with the tenant it was read
    // for (the caller, or the end tenant a service acted for).
    std::set<std::pair<std::string, std::string>> namespaces;  // (tenant, namespace)
    std::set<uint64_t> leases;
    bool may_write = true;                   // its tenant's right when it opened: staging
    uint64_t staging_wanted = 0;             // granted on proof, if the budget allows
    uint64_t device_wanted = 0;              // likewise
    std::shared_ptr<StagingRegion> staging;  // null: none granted
    std::shared_ptr<DeviceStaging> device;   // null: none granted
    // The certificate chain its client presented (empty: none, or not
    // checked), the trust that last verified it and until when it holds.
    std::string peer_chain;
    std::shared_ptr<const PeerTrust> verified_with;
    absl::Time trusted_until = absl::InfiniteFuture();
    uint64_t order = 0;  // of opening: a tenant over its limit keeps its oldest
  };
  struct FastLease {
    uint64_t session_id;
    std::multimap<absl::Time, uint64_t>::iterator deadline;  // in lease_deadlines_
    std::vector<std::shared_ptr<const PinnedBlock>> blocks;
    std::vector<uint64_t> device_ranges;  // offsets held in the session's device staging
  };

  FastPathServer(const FastPathOptions& options, BlockStore* store, Clock* clock, int listener, int wake);
  void Loop();
  // Answers one message on a connection; false when it should be closed.
  bool Serve(int socket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseConnectionLocked(int socket) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndSessionLocked(uint64_t session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EndLeaseLocked(uint64_t lease_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A session just proven gets its staging region and its GPU buffer, as
  // much of each as is wanted and left of its budget.
  void GrantStagingLocked(Session& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GrantDeviceStagingLocked(Session& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A block pinned in the GPU tier, the range of device staging it goes to,
  // and its answer.
  struct ToDevice {
    v1::LeasedBlock* out;
    std::shared_ptr<const PinnedBlock> block;
    uint64_t at;
  };
  // Copies a lease's GPU-tier blocks into their ranges of `device`, one
  // batch of copies; those copied are described in their answers, noted
  // in `ranges`, counted in `bytes` and kept pinned in `pinned`; the others
  // are answered UNAVAILABLE (read them with Get) and their ranges freed.
  void CopyToDevice(DeviceStaging& device, std::vector<ToDevice>& blocks,
                    std::vector<std::shared_ptr<const PinnedBlock>>& pinned, uint64_t& bytes,
                    std::vector<uint64_t>& ranges);
  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Verifies again the chains of the sessions that the trust in force has
  // not verified, or whose verification fell due, and ends those it
  // refuses; on the loop's thread, the verifications outside mu_.
  void RecheckPeers() ABSL_LOCKS_EXCLUDED(mu_);
  // Ends a session on the loop's thread: its connection closed if proven.
  void EndOnLoopLocked(uint64_t session_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the sessions KeepTenants does not keep; on the loop's thread,
  // which alone closes the sockets it polls.
  void EndSessionsNotKeptLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The sessions KeepTenants does not keep, each with why ("tenant NAME
  // may hold 2 fast path sessions now: its 1 newest end").
  std::map<uint64_t, std::string> NotKeptLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why KeepTenants keeps none of `session`'s tenant's sessions; nullopt
  // when it keeps some.
  std::optional<std::string> WhyNotKeptLocked(const Session& session) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const FastPathOptions options_;
  BlockStore* const store_;
  Clock* const clock_;
  const int listener_;
  const int wake_;  // eventfd: stops the loop
  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Session> sessions_ ABSL_GUARDED_BY(mu_);
  struct Connection {
    uint64_t session = 0;  // the session it proved; 0: not yet
    absl::Time accepted;   // closed if not proven within prove_within
    uint64_t order = 0;    // of acceptance: the oldest goes first
    uid_t uid = 0;         // the peer's, from SO_PEERCRED
  };
  // Accepts one connection, closing the oldest unproven one(s) its room
  // needs; refuses it when every connection is proven.
  void AcceptLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::flat_hash_map<int, Connection> connections_ ABSL_GUARDED_BY(mu_);
  uint64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, FastLease> leases_ ABSL_GUARDED_BY(mu_);
  // The leases by deadline, soonest first: expiry looks only at those due.
  std::multimap<absl::Time, uint64_t> lease_deadlines_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> sessions_by_tenant_ ABSL_GUARDED_BY(mu_);
  // The tenants KeepTenants named, each with whether it may write and the
  // most sessions it may hold (nullopt: any, as its caller says), and
  // whether sessions it does not keep are left to end.
  struct KeptTenant {
    bool may_write = true;
    size_t max_sessions = 0;
  };
  std::optional<absl::flat_hash_map<std::string, KeptTenant>> kept_tenants_ ABSL_GUARDED_BY(mu_);
  uint64_t sessions_opened_ ABSL_GUARDED_BY(mu_) = 0;
  bool sessions_to_end_ ABSL_GUARDED_BY(mu_) = false;
  FastPathCounters counters_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_FAST_PATH_FAST_PATH_SERVER_H_
