// A reader of a cache's bulk stream (bulk_stream.h): Get requests over one
// TCP connection, each record received straight into the caller's buffer
// (no receive buffer in between: the kernel's copy is the only one). Not
// thread-safe: one request at a time; open one client per thread.
#ifndef KVTIER_SERVICES_CACHE_BULK_CLIENT_H_
#define KVTIER_SERVICES_CACHE_BULK_CLIENT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtier/v1/cache.pb.h"
#include "services/cache/raw_get.h"

namespace kvtier::cache {

class BulkClient {
 public:
  // Connects to HOST:PORT. `io_timeout` bounds each wait for the cache.
  static absl::StatusOr<std::unique_ptr<BulkClient>> Connect(const std::string& address,
                                                             absl::Duration io_timeout = absl::Seconds(60));
  ~BulkClient();
  BulkClient(const BulkClient&) = delete;
  BulkClient& operator=(const BulkClient&) = delete;

  // Runs one Get request, as RawGet does: each record lands in
  // `destination(index, size)`, then `on_block` sees the answer; answers
  // come in request order. Returns the request's status (the cache's
  // refusal, such as INVALID_ARGUMENT), or UNAVAILABLE / INTERNAL when the
  // connection broke or the cache's answer was malformed, RESOURCE_EXHAUSTED
  // when the cache serves as many connections as it will; after those the
  // client is broken() and every later call fails.
  absl::Status Get(const v1::GetRequest& request, const RecordDestination& destination,
                   const std::function<void(const RawBlock&)>& on_block);
  bool broken() const { return fd_ < 0; }

 private:
  explicit BulkClient(int fd) : fd_(fd) {}
  absl::Status Receive(size_t blocks, const RecordDestination& destination,
                       const std::function<void(const RawBlock&)>& on_block);
  int fd_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_BULK_CLIENT_H_
