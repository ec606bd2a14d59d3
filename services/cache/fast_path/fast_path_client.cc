#include "services/cache/fast_path/fast_path_client.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "services/base/usable_cpus.h"
#include "services/cache/fast_path/fast_path_socket.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/crc32c.h"
#include "services/rpc/grpc_status.h"
#if KVTIER_HAVE_CUDA
#include "kvtier/kernels/cuda_codec.h"
#include "kvtier/kernels/cuda_ipc.h"
#endif

namespace kvtier::cache {

#if KVTIER_HAVE_CUDA
struct FastPathClient::DeviceMapping {
  std::unique_ptr<kernels::cuda::IpcMapping> mapping;
};

uint64_t FastPathClient::DeviceStagingWanted() {
  std::string why;
  return kernels::cuda::DevicePresent(&why) ? uint64_t{64} << 20 : 0;
}
#else
struct FastPathClient::DeviceMapping {};

uint64_t FastPathClient::DeviceStagingWanted() { return 0; }
#endif

namespace {

// Whether a record ends in `crc`, the CRC32C of the bytes before its trailer.
bool EndsInCrc(std::span<const uint8_t> record, uint32_t crc) {
  uint32_t stored;
  std::memcpy(&stored, record.data() + record.size() - kvblock::kBlockTrailerBytes, sizeof stored);
  return stored == crc;
}

}  // namespace

struct FastPathClient::Mapping {
  Mapping(const uint8_t* base, size_t size, uint64_t generation) : base(base), size(size), generation(generation) {}
  ~Mapping() { munmap(const_cast<uint8_t*>(base), size); }
  const uint8_t* base;
  size_t size;
  uint64_t generation;
};

absl::StatusOr<std::unique_ptr<FastPathClient>> FastPathClient::Connect(std::shared_ptr<grpc::Channel> channel,
                                                                        absl::Duration deadline, uint64_t staging_bytes,
                                                                        uint64_t device_staging_bytes) {
  CacheClient client(channel, deadline);
  grpc::ClientContext context;
  client.SetDeadline(context);
  v1::OpenFastPathRequest open;
  open.set_staging_bytes(staging_bytes);
  open.set_device_staging_bytes(device_staging_bytes);
  open.set_host_boot_id(fastpath::HostBootId());
  v1::OpenFastPathResponse opened;
  if (grpc::Status s = client.stub().OpenFastPath(&context, open, &opened); !s.ok()) {
    return FromGrpcStatus(s);
  }
  fastpath::Request hello{fastpath::RequestKind::kHello};
  hello.session_id = opened.session_id();
  if (opened.secret().size() != hello.secret.size()) {
    return absl::UnavailableError("cache sent a malformed fast path secret");
  }
  std::memcpy(hello.secret.data(), opened.secret().data(), hello.secret.size());
  // Reaching the socket and being recognised there is what proves the cache
  // shares this host.
  absl::StatusOr<int> socket = fastpath::Connect(opened.socket_path());
  if (!socket.ok()) return absl::UnavailableError(socket.status().message());
  int staging_fd = -1;          // comes with the answer when a region was granted
  fastpath::DeviceGrant grant;  // likewise a GPU buffer's handle
  absl::Status proven = fastpath::SendRequest(*socket, hello);
  if (proven.ok()) proven = fastpath::ReceiveReply(*socket, staging_fd, &grant);
  if (!proven.ok()) {
    close(*socket);
    return absl::UnavailableError(absl::StrCat("fast path socket ", opened.socket_path(), ": ", proven.message()));
  }
  uint8_t* staging = nullptr;
  uint64_t staging_size = 0;
  struct stat st;
  if (staging_fd >= 0 && fstat(staging_fd, &st) == 0 && st.st_size > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_SHARED, staging_fd, 0);
    if (p != MAP_FAILED) staging = static_cast<uint8_t*>(p), staging_size = static_cast<uint64_t>(st.st_size);
  }
  if (staging_fd >= 0) close(staging_fd);
  // Without it, blocks the cache puts in device staging are read over TCP.
  std::unique_ptr<DeviceMapping> device;
#if KVTIER_HAVE_CUDA
  if (grant.bytes > 0) {
    auto d = std::make_unique<DeviceMapping>();
    if (kernels::cuda::IpcMapping::Open(grant.ipc_handle, grant.bytes, d->mapping).ok()) device = std::move(d);
  }
#endif
  return std::unique_ptr<FastPathClient>(new FastPathClient(std::move(channel), deadline, opened.session_id(), *socket,
                                                            staging, staging_size, std::move(device)));
}

FastPathClient::FastPathClient(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline, uint64_t session_id,
                               int socket, uint8_t* staging, uint64_t staging_size,
                               std::unique_ptr<DeviceMapping> device)
    : client_(std::move(channel), deadline),
      session_id_(session_id),
      socket_(socket),
      staging_(staging),
      staging_size_(staging_size),
      chunk_bytes_(std::min(kStagingChunk, staging_size)),
      device_(std::move(device)) {
  if (chunk_bytes_ == 0) return;
  for (uint32_t c = static_cast<uint32_t>(staging_size / chunk_bytes_); c > 0; --c) free_chunks_.push_back(c - 1);
}

FastPathClient::~FastPathClient() {
  if (staging_ != nullptr) munmap(staging_, staging_size_);
  close(socket_);
}

FastPathClient::StagedStream::~StagedStream() {
  absl::MutexLock lock(&client_->staging_mu_);
  client_->free_chunks_.insert(client_->free_chunks_.end(), chunks_.begin(), chunks_.end());
}

std::optional<v1::StagedRange> FastPathClient::StagedStream::Stage(std::string_view record) {
  const uint64_t chunk = client_->chunk_bytes_;
  if (record.size() > chunk) return std::nullopt;
  if (chunks_.empty() || used_ + record.size() > chunk) {
    absl::MutexLock lock(&client_->staging_mu_);
    if (client_->free_chunks_.empty()) return std::nullopt;
    chunks_.push_back(client_->free_chunks_.back());
    client_->free_chunks_.pop_back();
    used_ = 0;
  }
  v1::StagedRange range;
  range.set_offset(uint64_t{chunks_.back()} * chunk + used_);
  range.set_length(record.size());
  std::memcpy(client_->staging_ + range.offset(), record.data(), record.size());
  used_ += record.size();
  return range;
}

size_t FastPathClient::mapped_segments() {
  absl::MutexLock lock(&mu_);
  return mappings_.size();
}

absl::StatusOr<std::shared_ptr<const FastPathClient::Mapping>> FastPathClient::MappingFor(uint32_t tier,
                                                                                          uint32_t segment,
                                                                                          uint64_t generation) {
  absl::MutexLock lock(&mu_);
  std::shared_ptr<const Mapping>& slot = mappings_[{tier, segment}];
  if (slot != nullptr && slot->generation == generation) return slot;
  slot.reset();  // an older generation: its bytes are gone
  fastpath::Request request{fastpath::RequestKind::kSegment};
  request.tier = tier;
  request.segment = segment;
  request.generation = generation;
  int fd = -1;
  absl::Status s = fastpath::SendRequest(socket_, request);
  if (s.ok()) s = fastpath::ReceiveReply(socket_, fd);
  if (s.ok() && fd < 0) s = absl::UnavailableError("cache sent no descriptor");
  if (!s.ok()) {
    mappings_.erase({tier, segment});
    return s;
  }
  struct stat st;
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && st.st_size > 0) {
    // Not MAP_POPULATE: slower than the faults of the first copy, which
    // map 16 pages each (load/README.md, cache_bench).
    base = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (base == MAP_FAILED) {
    mappings_.erase({tier, segment});
    return absl::UnavailableError(absl::StrCat("cannot map segment ", segment, ": ", std::strerror(errno)));
  }
  slot =
      std::make_shared<const Mapping>(static_cast<const uint8_t*>(base), static_cast<size_t>(st.st_size), generation);
  return slot;
}

bool FastPathClient::CopyRecord(const v1::SharedRecord& record, std::span<uint8_t> out) {
  const uint64_t size = record.size();
  if (size < kvblock::kBlockTrailerBytes || size > out.size()) return false;
  const uint64_t checked = size - kvblock::kBlockTrailerBytes;  // bytes before the CRC
  uint64_t at = 0;
  uint32_t crc = 0;
  for (const v1::SharedPiece& piece : record.pieces()) {
    absl::StatusOr<std::shared_ptr<const Mapping>> mapping =
        MappingFor(piece.tier_index(), piece.segment(), piece.generation());
    if (!mapping.ok()) return false;
    const Mapping& m = **mapping;
    // Checked against what is really mapped, never trusting the answer.
    if (piece.offset() > m.size || piece.length() > m.size - piece.offset() || piece.length() > size - at) {
      return false;
    }
    // Copy, then sum the chunk while it is still in cache (a fused 8-byte
    // copy-and-sum loop was slower).
    constexpr uint64_t kChunk = 32 * 1024;
    for (uint64_t done = 0; done < piece.length(); done += kChunk) {
      const uint64_t n = std::min(kChunk, piece.length() - done);
      uint8_t* to = out.data() + at;
      std::memcpy(to, m.base + piece.offset() + done, n);
      if (at < checked) crc = kvblock::Crc32cExtend(crc, to, std::min(n, checked - at));
      at += n;
    }
  }
  return at == size && EndsInCrc(out.first(size), crc);
}

bool FastPathClient::CopyDeviceRecord(const v1::DeviceRecord& record, std::span<uint8_t> out) {
#if KVTIER_HAVE_CUDA
  const uint64_t size = record.size();
  if (device_ == nullptr || size < kvblock::kBlockTrailerBytes || size > out.size() ||
      !device_->mapping->CopyToHost(record.offset(), out.data(), size).ok()) {
    return false;
  }
  return EndsInCrc(out.first(size), kvblock::Crc32c(out.data(), size - kvblock::kBlockTrailerBytes));
#else
  (void)record, (void)out;
  return false;
#endif
}

void FastPathClient::ReleaseSoon(uint64_t lease_id) {
  // Over the session's socket: one send, no answer to wait for (a gRPC
  // ReleaseLease held this thread for a round trip). If it is lost, the
  // lease's deadline ends it.
  fastpath::Request release{fastpath::RequestKind::kRelease};
  release.generation = lease_id;
  absl::MutexLock lock(&mu_);
  (void)fastpath::SendRequest(socket_, release);
}

absl::StatusOr<std::vector<uint32_t>> FastPathClient::Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                                                            const std::vector<kvblock::BlockHash>& hashes,
                                                            const RecordDestination& destination,
                                                            const std::function<void(const RawBlock&)>& on_block) {
  v1::LeaseBlocksRequest request;
  request.set_session_id(session_id_);
  request.set_kv_namespace(ns);
  *request.mutable_layout() = kvblock::LayoutToProto(layout);
  for (const kvblock::BlockHash& h : hashes) request.add_block_hashes(std::string(kvblock::HashAsBytes(h)));
  v1::LeaseBlocksResponse leased;
  {
    grpc::ClientContext context;
    client_.SetDeadline(context);
    if (grpc::Status s = client_.stub().LeaseBlocks(&context, request, &leased); !s.ok()) {
      return FromGrpcStatus(s);
    }
  }
  // Copies run on up to two threads; the callbacks, one at a time.
  absl::Mutex callback_mu;
  std::vector<uint32_t> fallback;
  const auto deliver = [&](const v1::LeasedBlock& b) {
    if (b.index() >= hashes.size()) return;
    RawBlock block;
    block.index = b.index();
    block.tier = b.tier();
    if (b.has_miss()) {
      block.status = absl::Status(static_cast<absl::StatusCode>(b.miss().code()), b.miss().message());
      absl::MutexLock lock(&callback_mu);
      if (block.status.code() == absl::StatusCode::kNotFound || block.status.code() == absl::StatusCode::kDataLoss) {
        on_block(block);
      } else {
        fallback.push_back(b.index());
      }
      return;
    }
    const uint64_t size = b.has_device() ? b.device().size() : b.shared().size();
    std::span<uint8_t> out;
    {
      absl::MutexLock lock(&callback_mu);
      out = destination(b.index(), size);
    }
    const bool copied = b.has_device() ? CopyDeviceRecord(b.device(), out) : CopyRecord(b.shared(), out);
    absl::MutexLock lock(&callback_mu);
    if (!copied) {
      fallback.push_back(b.index());
      return;
    }
    block.size = size;
    on_block(block);
  };
  uint64_t shared_bytes = 0;
  for (const v1::LeasedBlock& b : leased.blocks()) {
    shared_bytes += b.has_shared() ? b.shared().size() : b.has_device() ? b.device().size() : 0;
  }
  const int n = leased.blocks_size();
  // Large reads split in two: the page faults of a first read of fresh
  // mappings run in parallel. (The CPUs counted once: it reads files.)
  static const bool spare_cpu = UsableCpus() > 1;
  if (shared_bytes >= kTwoThreadBytes && spare_cpu) {
    std::thread helper([&] {
      for (int i = n / 2; i < n; ++i) deliver(leased.blocks(i));
    });
    for (int i = 0; i < n / 2; ++i) deliver(leased.blocks(i));
    helper.join();
  } else {
    for (const v1::LeasedBlock& b : leased.blocks()) deliver(b);
  }
  if (leased.lease_id() != 0) ReleaseSoon(leased.lease_id());
  return fallback;
}

}  // namespace kvtier::cache
