#include "services/cache/fast_path/fast_path_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/base/status.h"
#include "services/cache/fast_path/fast_path_socket.h"

namespace kvtier::cache {
namespace {

// Where a leased block is not in shared memory nor copied to device
// staging: the client reads it with Get.
void NotInSharedMemory(v1::LeasedBlock& out) {
  out.mutable_miss()->set_code(static_cast<int>(absl::StatusCode::kUnavailable));
  out.mutable_miss()->set_message("block is not in shared memory; read it with Get");
}

void RandomBytes(void* out, size_t n) {
  auto* p = static_cast<uint8_t*>(out);
  while (n > 0) {
    const ssize_t got = getrandom(p, n, 0);
    if (got > 0) p += got, n -= static_cast<size_t>(got);
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<StagingRegion>> StagingRegion::Create(uint64_t bytes) {
  const int fd = memfd_create("kvtier-cache-staging", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::ResourceExhaustedError(absl::StrCat("memfd: ", std::strerror(errno)));
  void* base = MAP_FAILED;
  // Sealed size: the client cannot shrink it under this mapping.
  if (ftruncate(fd, static_cast<off_t>(bytes)) == 0 &&
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0) {
    base = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  }
  if (base == MAP_FAILED) {
    const absl::Status s = absl::ResourceExhaustedError(absl::StrCat("staging region: ", std::strerror(errno)));
    close(fd);
    return s;
  }
  return std::shared_ptr<StagingRegion>(new StagingRegion(fd, static_cast<const char*>(base), bytes));
}

StagingRegion::~StagingRegion() {
  munmap(const_cast<char*>(base_), size_);
  close(fd_);
}

absl::StatusOr<std::string_view> StagingRegion::Range(uint64_t offset, uint64_t length) const {
  if (offset > size_ || length > size_ - offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("staged range [", offset, ", +", length, ") is outside the ", size_, "-byte staging region"));
  }
  return std::string_view(base_ + offset, length);
}

absl::StatusOr<std::unique_ptr<FastPathServer>> FastPathServer::Start(const FastPathOptions& options, BlockStore* store,
                                                                      Clock* clock) {
  absl::StatusOr<int> listener = fastpath::Listen(options.socket_path);
  if (!listener.ok()) return listener.status();
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) {
    close(*listener);
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  return std::unique_ptr<FastPathServer>(new FastPathServer(options, store, clock, *listener, wake));
}

FastPathServer::FastPathServer(const FastPathOptions& options, BlockStore* store, Clock* clock, int listener, int wake)
    : options_(options), store_(store), clock_(clock), listener_(listener), wake_(wake) {
  thread_ = std::thread([this] { Loop(); });
}

void FastPathServer::Stop() {
  if (!thread_.joinable()) return;
  const uint64_t one = 1;
  (void)!write(wake_, &one, sizeof one);
  thread_.join();
  {
    absl::MutexLock lock(&mu_);
    while (!connections_.empty()) CloseConnectionLocked(connections_.begin()->first);
    while (!sessions_.empty()) EndSessionLocked(sessions_.begin()->first);  // opened, never proven
  }
  close(listener_);
  if (options_.socket_path[0] != '@') unlink(options_.socket_path.c_str());
}

FastPathServer::~FastPathServer() {
  Stop();
  close(wake_);
}

std::optional<uint64_t> FastPathServer::DeviceStaging::Allocate(uint64_t size) {
  uint64_t at = 0;
  for (const auto& [offset, length] : used) {
    if (offset - at >= size) break;
    at = offset + length;
  }
  if (at > buffer->size() || buffer->size() - at < size) return std::nullopt;
  used[at] = size;
  return at;
}

absl::StatusOr<v1::OpenFastPathResponse> FastPathServer::Open(const v1::OpenFastPathRequest& request,
                                                              const Caller& caller, const std::string& peer_chain) {
  if (!request.host_boot_id().empty() && !fastpath::HostBootId().empty() &&
      request.host_boot_id() != fastpath::HostBootId()) {
    return absl::FailedPreconditionError("the client is on another host: no fast path");
  }
  const std::shared_ptr<const PeerTrust> trust =
      options_.trust && !peer_chain.empty() ? options_.trust() : std::shared_ptr<const PeerTrust>();
  absl::Time trusted_until = absl::InfiniteFuture();
  if (trust != nullptr) {
    KVTIER_ASSIGN_OR_RETURN(trusted_until, trust->VerifyClient(peer_chain));
  }
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  // The file as the last reload read it, over the caller's (a call
  // authenticated under the one before).
  bool may_write = caller.SessionOwnerMayWrite();
  if (kept_tenants_.has_value()) {
    auto kept = kept_tenants_->find(caller.SessionOwner());
    if (kept == kept_tenants_->end()) {
      return absl::PermissionDeniedError(absl::StrCat(caller.Describe(), " is no longer in the tenants file"));
    }
    may_write = kept->second.may_write;
  }
  if (sessions_.size() >= options_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(sessions_.size(), " fast path sessions are open, the limit"));
  }
  const size_t tenant_limit =
      caller.quota.max_sessions() > 0 ? caller.quota.max_sessions() : options_.max_sessions_per_tenant;
  size_t& held = sessions_by_tenant_[caller.SessionOwner()];
  if (held >= tenant_limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(caller.Describe(), " holds ", held, " fast path sessions, the most it may"));
  }
  ++held;
  uint64_t id = 0;
  while (id == 0 || sessions_.contains(id)) RandomBytes(&id, sizeof id);
  Session& session = sessions_[id];
  session.tenant = caller.SessionOwner();
  session.order = ++sessions_opened_;
  RandomBytes(session.secret.data(), session.secret.size());
  session.open_until = clock_->Now() + options_.prove_within;
  if (trust != nullptr) {
    session.peer_chain = peer_chain;
    session.verified_with = trust;
    session.trusted_until = trusted_until;
  }
  // Whole pages within this session's share, granted once it is proven (an
  // unproven session, from anywhere, holds none of the budget); none for a
  // reader, whose Puts are refused.
  session.may_write = may_write;
  if (may_write) {
    session.staging_wanted = std::min(request.staging_bytes(), options_.max_staging_per_session) & ~uint64_t{4095};
  }
  // GPU clients get a device buffer of their own when the device tier is on
  // a GPU (its blocks are copied there, device to device, per lease), also
  // only once proven: an unproven session holds no GPU memory.
  if (store_->storage(0).slab() != nullptr) {
    session.device_wanted = std::min(request.device_staging_bytes(), options_.max_device_staging);
  }
  v1::OpenFastPathResponse response;
  response.set_staging_bytes(session.staging_wanted);
  response.set_device_staging_bytes(session.device_wanted);
  response.set_session_id(id);
  response.set_secret(session.secret.data(), session.secret.size());
  response.set_socket_path(options_.socket_path);
  response.set_prove_within_ms(absl::ToInt64Milliseconds(options_.prove_within));
  return response;
}

absl::Status FastPathServer::Lease(uint64_t session_id, const std::string& ns, uint64_t layout_id,
                                   const std::vector<kvblock::BlockHash>& hashes, absl::Duration ttl,
                                   v1::LeaseBlocksResponse& response, const Caller& caller) {
  const std::string& tenant = caller.SessionOwner();
  const auto check_session = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    auto it = sessions_.find(session_id);
    if (it == sessions_.end() || it->second.socket < 0 || it->second.tenant != tenant) {
      return absl::FailedPreconditionError(
          absl::StrCat("fast path session ", absl::Hex(session_id), " is unknown or not proven"));
    }
    if (it->second.leases.size() >= options_.max_leases_per_session) {
      return absl::ResourceExhaustedError(
          absl::StrCat("session holds ", it->second.leases.size(), " leases, the limit; release some"));
    }
    return absl::OkStatus();
  };
  std::shared_ptr<DeviceStaging> device;  // kept alive while copying into it
  {
    absl::MutexLock lock(&mu_);
    ExpireLocked();
    if (absl::Status s = check_session(); !s.ok()) return s;
    device = sessions_[session_id].device;
  }
  std::vector<uint64_t> device_ranges;
  std::vector<ToDevice> to_device;
  // Pinning may promote (and so copy) blocks: done without the lock. The
  // reader verifies each record's checksum as it copies it, so the records
  // are not read here too.
  std::vector<std::shared_ptr<const PinnedBlock>> pinned;
  uint64_t bytes = 0;
  // A block is promoted only into a first tier it can be handed out from
  // (not a GPU's), so a host-tier block is read where it is.
  BlockStore::ReadOptions read;
  read.verify_checksum = false;
  read.promote = store_->storage(0).shareable();
  read.copy_out = false;  // a block on disk or in a GPU tier is not read here
  for (size_t i = 0; i < hashes.size(); ++i) {
    v1::LeasedBlock* out = response.add_blocks();
    out->set_index(static_cast<uint32_t>(i));
    absl::StatusOr<std::shared_ptr<const PinnedBlock>> block = store_->Read(ns, layout_id, hashes[i], read);
    if (!block.ok()) {
      out->mutable_miss()->set_code(static_cast<int>(block.status().code()));
      out->mutable_miss()->set_message(std::string(block.status().message()));
      continue;
    }
    out->set_tier(static_cast<v1::Tier>((*block)->tier()));
    const std::vector<SharedPiece> pieces = store_->SharedPieces(**block);
    if (pieces.empty()) {
      // In a GPU tier: device to device, for a session with device staging,
      // all of the lease's such blocks at once below.
      std::optional<uint64_t> at;
      if (device != nullptr) {
        absl::MutexLock lock(&mu_);
        at = device->Allocate((*block)->size());
      }
      if (!at.has_value()) {  // no device staging, or it is full
        NotInSharedMemory(*out);
        continue;
      }
      to_device.push_back({out, *std::move(block), *at});
      continue;
    }
    v1::SharedRecord* record = out->mutable_shared();
    record->set_size((*block)->size());
    for (const SharedPiece& p : pieces) {
      v1::SharedPiece* piece = record->add_pieces();
      piece->set_tier_index(p.tier);
      piece->set_segment(p.segment);
      piece->set_generation(p.generation);
      piece->set_offset(p.offset);
      piece->set_length(p.length);
    }
    bytes += (*block)->size();
    pinned.push_back(*std::move(block));
  }
  if (!to_device.empty()) CopyToDevice(*device, to_device, pinned, bytes, device_ranges);
  store_->Refresh(ns, layout_id, hashes);
  absl::MutexLock lock(&mu_);
  if (absl::Status s = check_session(); !s.ok()) return s;  // it died meanwhile (its staging with it)
  if (pinned.empty()) return absl::OkStatus();
  Session& session = sessions_[session_id];
  session.namespaces.emplace(caller.tenant, ns);
  uint64_t id = 0;  // unguessable: the id alone releases it
  while (id == 0 || leases_.contains(id)) {
    RandomBytes(&id, sizeof id);
    id |= kFastPathLeaseBit;
  }
  if (ttl <= absl::ZeroDuration()) ttl = options_.default_lease_ttl;
  const absl::Time deadline = clock_->Now() + std::min(ttl, options_.max_lease_ttl);
  counters_.blocks_out += pinned.size();
  counters_.bytes_out += bytes;
  leases_[id] =
      FastLease{session_id, lease_deadlines_.emplace(deadline, id), std::move(pinned), std::move(device_ranges)};
  session.leases.insert(id);
  response.set_lease_id(id);
  response.set_lease_deadline_unix_ms(absl::ToUnixMillis(deadline));
  return absl::OkStatus();
}

absl::Status FastPathServer::Release(uint64_t lease_id, const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  auto lease = leases_.find(lease_id);
  auto session = lease == leases_.end() ? sessions_.end() : sessions_.find(lease->second.session_id);
  if (session == sessions_.end() || session->second.tenant != tenant) {
    return absl::NotFoundError(absl::StrCat("lease ", lease_id, " is unknown or expired"));
  }
  EndLeaseLocked(lease_id);
  return absl::OkStatus();
}

void FastPathServer::EndLeaseLocked(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  auto session = sessions_.find(it->second.session_id);
  if (session != sessions_.end()) {
    session->second.leases.erase(lease_id);
    if (session->second.device != nullptr) {
      for (uint64_t offset : it->second.device_ranges) session->second.device->used.erase(offset);
    }
  }
  lease_deadlines_.erase(it->second.deadline);
  leases_.erase(it);  // unpins its blocks
}

void FastPathServer::CopyToDevice(DeviceStaging& device, std::vector<ToDevice>& blocks,
                                  std::vector<std::shared_ptr<const PinnedBlock>>& pinned, uint64_t& bytes,
                                  std::vector<uint64_t>& ranges) {
  // A batch a tier (there is one GPU tier).
  std::map<size_t, std::vector<ToDevice*>> by_tier;
  for (ToDevice& b : blocks) by_tier[b.block->tier_index()].push_back(&b);
  for (const auto& [tier, batch] : by_tier) {
    std::vector<TierStorage::ToExport> records;
    for (const ToDevice* b : batch) records.push_back({b->block->room(), b->at});
    const bool copied = store_->storage(tier).CopyToExported(records, *device.buffer).ok();
    for (ToDevice* b : batch) {
      if (!copied) {  // these blocks go over TCP
        absl::MutexLock lock(&mu_);
        device.used.erase(b->at);
        NotInSharedMemory(*b->out);
        continue;
      }
      b->out->mutable_device()->set_offset(b->at);
      b->out->mutable_device()->set_size(b->block->size());
      ranges.push_back(b->at);
      bytes += b->block->size();
      pinned.push_back(std::move(b->block));
    }
  }
}

FastPathCounters FastPathServer::Counters() {
  absl::MutexLock lock(&mu_);
  ExpireLocked();
  return counters_;
}

bool FastPathServer::AwaitSessions(uint64_t sessions, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  const auto open = [this, sessions]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return counters_.sessions == sessions; };
  return mu_.AwaitWithTimeout(absl::Condition(&open), timeout);
}

void FastPathServer::ExpireLocked() {
  const absl::Time now = clock_->Now();
  while (!lease_deadlines_.empty() && lease_deadlines_.begin()->first <= now) {
    EndLeaseLocked(lease_deadlines_.begin()->second);
  }
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    auto next = std::next(it);
    if (it->second.socket < 0 && it->second.open_until <= now) EndSessionLocked(it->first);
    it = next;
  }
}

std::vector<std::string> FastPathServer::KeepTenants(const TenantRegistry::TenantList& tenants) {
  absl::MutexLock lock(&mu_);
  kept_tenants_.emplace();
  for (const auto& tenant : tenants) {
    const uint32_t quota = tenant->quota.max_sessions();
    kept_tenants_->emplace(tenant->tenant,
                           KeptTenant{tenant->MayWrite(), quota > 0 ? quota : options_.max_sessions_per_tenant});
  }
  std::set<std::string> ending;  // once a tenant, in order
  for (auto& [id, why] : NotKeptLocked()) ending.insert(std::move(why));
  sessions_to_end_ = !ending.empty();
  return {ending.begin(), ending.end()};
}

std::map<uint64_t, std::string> FastPathServer::NotKeptLocked() const {
  std::map<uint64_t, std::string> ending;
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> kept;  // (order, id) by tenant
  for (const auto& [id, session] : sessions_) {
    if (std::optional<std::string> why = WhyNotKeptLocked(session)) {
      ending.emplace(id, *std::move(why));
    } else {
      kept[session.tenant].emplace_back(session.order, id);
    }
  }
  for (auto& [tenant, sessions] : kept) {
    const size_t most = kept_tenants_->at(tenant).max_sessions;
    if (sessions.size() <= most) continue;
    std::sort(sessions.begin(), sessions.end());
    const std::string why = absl::StrCat("tenant ", tenant, " may hold ", most, " fast path session",
                                         most == 1 ? "" : "s", " now: its ", sessions.size() - most, " newest end");
    for (size_t i = most; i < sessions.size(); ++i) ending.emplace(sessions[i].second, why);
  }
  return ending;
}

std::optional<std::string> FastPathServer::WhyNotKeptLocked(const Session& session) const {
  auto kept = kept_tenants_->find(session.tenant);
  if (kept == kept_tenants_->end()) {
    return absl::StrCat("tenant ", session.tenant, " is no longer in the file: its fast path sessions end");
  }
  if (kept->second.may_write == session.may_write) return std::nullopt;
  return absl::StrCat("tenant ", session.tenant, kept->second.may_write ? " may write now" : " may no longer write",
                      ": its fast path sessions end");
}

void FastPathServer::EndSessionsNotKeptLocked() {
  sessions_to_end_ = false;
  for (const auto& [id, why] : NotKeptLocked()) EndOnLoopLocked(id);
}

void FastPathServer::EndOnLoopLocked(uint64_t session_id) {
  const int socket = sessions_.at(session_id).socket;
  if (socket >= 0) {
    CloseConnectionLocked(socket);  // ends its session
  } else {
    EndSessionLocked(session_id);
  }
}

void FastPathServer::RecheckPeers() {
  const std::shared_ptr<const PeerTrust> trust = options_.trust ? options_.trust() : nullptr;
  if (trust == nullptr) return;
  const absl::Time now = absl::Now();  // certificates' times are the wall clock's, as OpenSSL reads them
  std::vector<std::pair<uint64_t, std::string>> due;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, session] : sessions_) {
      if (!session.peer_chain.empty() && (session.verified_with != trust || session.trusted_until <= now)) {
        due.emplace_back(id, session.peer_chain);
      }
    }
  }
  if (due.empty()) return;
  std::map<std::string, absl::StatusOr<absl::Time>> verdicts;  // by chain: a client's processes share one
  for (const auto& [id, chain] : due) {
    if (!verdicts.contains(chain)) verdicts.emplace(chain, trust->VerifyClient(chain));
  }
  std::map<std::pair<std::string, std::string>, size_t> ended;  // (tenant, why) -> sessions
  absl::MutexLock lock(&mu_);
  for (const auto& [id, chain] : due) {
    auto it = sessions_.find(id);
    if (it == sessions_.end()) continue;
    const absl::StatusOr<absl::Time>& verdict = verdicts.at(chain);
    if (verdict.ok()) {
      it->second.verified_with = trust;
      // Asked again a second on at the soonest, not on every turn.
      it->second.trusted_until = std::max(*verdict, now + absl::Seconds(1));
      continue;
    }
    ++ended[{it->second.tenant, std::string(verdict.status().message())}];
    EndOnLoopLocked(id);
  }
  for (const auto& [who, sessions] : ended) {
    Log(LogLevel::kWarning, "tls",
        absl::StrCat(sessions == 1 ? "a fast path session" : absl::StrCat(sessions, " fast path sessions"),
                     who.first.empty() ? "" : " of tenant " + who.first,
                     sessions == 1 ? " ends: " : " end: ", who.second));
  }
}

absl::StatusOr<std::shared_ptr<const StagingRegion>> FastPathServer::Staging(uint64_t session_id,
                                                                             const std::string& tenant) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end() || it->second.socket < 0 || it->second.staging == nullptr || it->second.tenant != tenant) {
    return absl::FailedPreconditionError(
        absl::StrCat("fast path session ", absl::Hex(session_id), " is unknown, unproven or has no staging region"));
  }
  return std::shared_ptr<const StagingRegion>(it->second.staging);
}

void FastPathServer::CountStaged(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  counters_.bytes_in += bytes;
}

void FastPathServer::EndSessionLocked(uint64_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  if (it->second.staging != nullptr) counters_.staging_bytes -= it->second.staging->size();
  if (it->second.device != nullptr) counters_.device_staging_bytes -= it->second.device->buffer->size();
  const std::set<uint64_t> leases = it->second.leases;  // EndLeaseLocked edits the set
  for (uint64_t lease : leases) EndLeaseLocked(lease);
  if (it->second.socket >= 0) --counters_.sessions;
  auto held = sessions_by_tenant_.find(it->second.tenant);
  if (--held->second == 0) sessions_by_tenant_.erase(held);
  sessions_.erase(it);
}

void FastPathServer::GrantStagingLocked(Session& session) {
  const uint64_t bytes =
      std::min(session.staging_wanted, options_.staging_budget - counters_.staging_bytes) & ~uint64_t{4095};
  if (bytes == 0) return;
  absl::StatusOr<std::shared_ptr<StagingRegion>> region = StagingRegion::Create(bytes);
  if (!region.ok()) return;  // Puts go over TCP
  session.staging = *std::move(region);
  counters_.staging_bytes += bytes;
}

void FastPathServer::GrantDeviceStagingLocked(Session& session) {
  // device_wanted is 0 unless the device tier is a slab.
  const uint64_t bytes =
      std::min(session.device_wanted, options_.device_staging_budget - counters_.device_staging_bytes);
  if (bytes == 0) return;
  absl::StatusOr<std::unique_ptr<ExportedBuffer>> buffer = store_->storage(0).slab()->Export(bytes);
  if (!buffer.ok()) return;  // the GPU tier's blocks go over TCP
  session.device = std::make_shared<DeviceStaging>();
  session.device->buffer = *std::move(buffer);
  counters_.device_staging_bytes += bytes;
}

void FastPathServer::CloseConnectionLocked(int socket) {
  auto it = connections_.find(socket);
  if (it->second.session != 0) EndSessionLocked(it->second.session);
  connections_.erase(it);
  close(socket);
}

bool FastPathServer::Serve(int socket) {
  fastpath::Request request;
  if (!fastpath::ReceiveRequest(socket, request).ok()) return false;
  uint64_t& proven = connections_[socket].session;
  if (request.kind == fastpath::RequestKind::kHello) {
    auto it = sessions_.find(request.session_id);
    if (proven != 0 || it == sessions_.end() || it->second.socket >= 0 || it->second.secret != request.secret) {
      (void)fastpath::SendReply(socket, absl::PermissionDeniedError("unknown session or wrong secret"));
      return false;
    }
    it->second.socket = socket;
    proven = request.session_id;
    ++counters_.sessions;
    // The staging region (writable) and the GPU buffer's handle travel with
    // the answer.
    GrantStagingLocked(it->second);
    GrantDeviceStagingLocked(it->second);
    const StagingRegion* staging = it->second.staging.get();
    fastpath::DeviceGrant device;
    if (const DeviceStaging* d = it->second.device.get(); d != nullptr) {
      const std::string handle = d->buffer->handle();
      device.bytes = d->buffer->size();
      std::memcpy(device.ipc_handle.data(), handle.data(), std::min(handle.size(), device.ipc_handle.size()));
    }
    return fastpath::SendReply(socket, absl::OkStatus(), staging != nullptr ? staging->fd() : -1, device).ok();
  }
  if (request.kind == fastpath::RequestKind::kRelease && proven != 0) {
    // Only the session's own leases; the client does not wait for an answer.
    if (sessions_[proven].leases.contains(request.generation)) EndLeaseLocked(request.generation);
    return true;
  }
  if (request.kind != fastpath::RequestKind::kSegment || proven == 0) {
    (void)fastpath::SendReply(socket, absl::InvalidArgumentError("say hello first"));
    return false;
  }
  // Only a segment of a namespace this session has read through a lease,
  // for a tenant that may still read it (the tenants file may have changed).
  absl::Status answer = absl::PermissionDeniedError("segment of a namespace this session has not read");
  for (const auto& [tenant, ns] : sessions_[proven].namespaces) {
    if (options_.may_read && !options_.may_read(tenant, ns)) continue;
    absl::StatusOr<int> fd = store_->OpenSegmentReadOnly(request.tier, request.segment, request.generation, ns);
    if (fd.ok()) {
      const bool sent = fastpath::SendReply(socket, absl::OkStatus(), *fd).ok();
      close(*fd);
      return sent;
    }
    if (fd.status().code() != absl::StatusCode::kPermissionDenied) {
      answer = fd.status();
      break;
    }
  }
  return fastpath::SendReply(socket, answer).ok();
}

void FastPathServer::Loop() {
  std::vector<pollfd> fds;
  for (;;) {
    RecheckPeers();
    {
      absl::MutexLock lock(&mu_);
      ExpireLocked();
      if (sessions_to_end_) EndSessionsNotKeptLocked();
      // Connections that never proved a session are closed here, on the
      // thread that polls them.
      const absl::Time now = clock_->Now();
      std::vector<int> stale;
      for (const auto& [socket, c] : connections_) {
        if (c.session == 0 && c.accepted + options_.prove_within <= now) stale.push_back(socket);
      }
      for (int socket : stale) CloseConnectionLocked(socket);
      fds.assign({{wake_, POLLIN, 0}, {listener_, POLLIN, 0}});
      for (const auto& [socket, c] : connections_) fds.push_back({socket, POLLIN, 0});
    }
    // The timeout bounds how late a lease expires.
    if (poll(fds.data(), fds.size(), 100) < 0) continue;
    if (fds[0].revents != 0) return;
    absl::MutexLock lock(&mu_);
    // Connections already here are served before new ones make room.
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      if (!Serve(fds[i].fd)) CloseConnectionLocked(fds[i].fd);
    }
    if (fds[1].revents & POLLIN) AcceptLocked();
  }
}

void FastPathServer::AcceptLocked() {
  const int socket = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (socket < 0) return;
  ucred peer{};
  socklen_t length = sizeof peer;
  if (getsockopt(socket, SOL_SOCKET, SO_PEERCRED, &peer, &length) != 0) {
    close(socket);
    return;
  }
  // One look over the connections: this uid's unproven ones, and the
  // oldest unproven of this uid and of anyone's.
  size_t unproven = 0;
  int oldest_of_uid = -1, oldest = -1;
  uint64_t order_of_uid = UINT64_MAX, order = UINT64_MAX;
  for (const auto& [s, c] : connections_) {
    if (c.session != 0) continue;
    if (c.order < order) oldest = s, order = c.order;
    if (c.uid != peer.uid) continue;
    ++unproven;
    if (c.order < order_of_uid) oldest_of_uid = s, order_of_uid = c.order;
  }
  if (unproven >= options_.max_unproven_per_uid && oldest_of_uid >= 0) {
    if (oldest == oldest_of_uid) oldest = -1;  // about to go
    CloseConnectionLocked(oldest_of_uid);
  }
  if (connections_.size() >= 2 * options_.max_sessions && oldest >= 0) CloseConnectionLocked(oldest);
  if (connections_.size() >= 2 * options_.max_sessions) {
    close(socket);
    return;
  }
  connections_[socket] = Connection{.session = 0, .accepted = clock_->Now(), .order = ++accepted_, .uid = peer.uid};
}

}  // namespace kvtier::cache
