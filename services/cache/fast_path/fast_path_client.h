// The client side of the same-host fast path (fast_path.md): a session with
// one kvtier-cache, proven local over its unix socket, through which blocks
// are read by copying their records straight out of the cache's shared
// segments (mapped read-only here) instead of through TCP.
//
// Never wrong bytes: a piece that does not fit its mapping, a segment whose
// descriptor cannot be had, or a block the cache holds outside shared memory
// is handed back for the caller to read with Get; a session the cache no
// longer knows (it restarted) makes Fetch fail, and the caller opens a new
// one. Records are checked against their CRC32C as they are copied (the
// cache leaves that check to the reader). Thread-safe.
#ifndef KVTIER_SERVICES_CACHE_FAST_PATH_FAST_PATH_CLIENT_H_
#define KVTIER_SERVICES_CACHE_FAST_PATH_FAST_PATH_CLIENT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "services/cache/client/cache_client.h"
#include "services/cache/client/raw_get.h"

namespace kvtier::cache {

class FastPathClient {
 public:
  // Opens and proves a session on the cache behind `channel`, asking for a
  // staging region of `staging_bytes` for staged Put (the cache may grant
  // less or none). FAILED_PRECONDITION when the cache has no fast path;
  // UNAVAILABLE when its socket cannot be reached or does not know the
  // session (another host, or another cache at that address).
  // With `device_staging_bytes` (a client on a host with the cache's GPU),
  // blocks in the cache's GPU tier come device to device through a buffer
  // of this session's (CUDA IPC) and are copied out of it here.
  static absl::StatusOr<std::unique_ptr<FastPathClient>> Connect(std::shared_ptr<grpc::Channel> channel,
                                                                 absl::Duration deadline, uint64_t staging_bytes = 0,
                                                                 uint64_t device_staging_bytes = 0);
  // How much device staging a client on this machine should ask for: 0
  // without CUDA or a GPU.
  static uint64_t DeviceStagingWanted();
  // Unmaps every segment and closes the session's socket (the cache then
  // ends its leases).
  ~FastPathClient();
  FastPathClient(const FastPathClient&) = delete;
  FastPathClient& operator=(const FastPathClient&) = delete;

  // Reads `hashes` of `ns`: each record is copied into
  // `destination(index, size)` (which must be at least `size` long; an empty
  // span declines it), then `on_block` sees the block. Definite misses
  // (NOT_FOUND, DATA_LOSS) go to `on_block` too. Returns the indices the
  // fast path did not serve, for the caller to read with Get. An error
  // (the call failed, the session is gone) means nothing was delivered.
  // Large reads copy on two threads; the callbacks are never called at
  // once, but not always in index order.
  absl::StatusOr<std::vector<uint32_t>> Fetch(const std::string& ns, const kvblock::LatentLayout& layout,
                                              const std::vector<kvblock::BlockHash>& hashes,
                                              const RecordDestination& destination,
                                              const std::function<void(const RawBlock&)>& on_block);

  uint64_t session_id() const { return session_id_; }
  uint64_t staging_bytes() const { return staging_size_; }
  bool has_device_staging() const { return device_ != nullptr; }

  // One Put stream's use of the staging region: records are copied into
  // chunks it takes, and the chunks go back when it is destroyed, which
  // must be after the stream ended (the cache has read them by then).
  // Not thread-safe (one stream).
  class StagedStream {
   public:
    explicit StagedStream(FastPathClient* client) : client_(client) {}
    ~StagedStream();
    StagedStream(const StagedStream&) = delete;
    StagedStream& operator=(const StagedStream&) = delete;
    // Copies `record` into the region; nullopt when there is no room (send
    // it inline instead).
    std::optional<v1::StagedRange> Stage(std::string_view record);

   private:
    FastPathClient* client_;
    std::vector<uint32_t> chunks_;
    uint64_t used_ = 0;  // in the last chunk
  };
  // Segments mapped now (for tests).
  size_t mapped_segments();

 private:
  struct Mapping;
  struct DeviceMapping;  // the session's device staging, opened (CUDA builds)
  FastPathClient(std::shared_ptr<grpc::Channel> channel, absl::Duration deadline, uint64_t session_id, int socket,
                 uint8_t* staging, uint64_t staging_size, std::unique_ptr<DeviceMapping> device);
  // Copies a record out of the device staging and checks its CRC32C.
  bool CopyDeviceRecord(const v1::DeviceRecord& record, std::span<uint8_t> out);
  // The segment mapped at `generation`: asks the cache for its descriptor
  // when it is not mapped yet or was mapped at another generation.
  absl::StatusOr<std::shared_ptr<const Mapping>> MappingFor(uint32_t tier, uint32_t segment, uint64_t generation);
  // Ends a lease without waiting for the answer.
  void ReleaseSoon(uint64_t lease_id);
  // Copies a leased record into `out` and checks its CRC32C on the way;
  // false if some piece cannot be read or the check fails.
  bool CopyRecord(const v1::SharedRecord& record, std::span<uint8_t> out);

  CacheClient client_;
  const uint64_t session_id_;
  absl::Mutex mu_;
  const int socket_;  // requests on it are made under mu_
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<const Mapping>> mappings_ ABSL_GUARDED_BY(mu_);
  static constexpr uint64_t kTwoThreadBytes = 8 << 20;
  // The staging region (writable), cut into chunks handed to streams.
  static constexpr uint64_t kStagingChunk = 4 << 20;
  uint8_t* const staging_;
  const uint64_t staging_size_;
  const uint64_t chunk_bytes_;  // kStagingChunk, or the whole of a smaller region
  absl::Mutex staging_mu_;
  std::vector<uint32_t> free_chunks_ ABSL_GUARDED_BY(staging_mu_);
  const std::unique_ptr<DeviceMapping> device_;  // null: none
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_FAST_PATH_FAST_PATH_CLIENT_H_
