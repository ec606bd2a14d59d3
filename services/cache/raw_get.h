// Reads a Get stream as raw bytes and lands each block's record straight in
// a caller's buffer: the record is copied once, from gRPC's receive buffers
// to its destination, never through a protobuf string. For readers that
// keep blocks in their own memory (the decode worker's pool, benchmarks).
// One stream per object; not thread-safe.
#ifndef KVTIER_SERVICES_CACHE_RAW_GET_H_
#define KVTIER_SERVICES_CACHE_RAW_GET_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/sync_stream.h>

#include "absl/status/statusor.h"
#include "kvtier/v1/cache.pb.h"

namespace kvtier::cache {

struct RawBlock {
  uint32_t index = 0;
  v1::Tier tier = v1::TIER_UNSPECIFIED;
  absl::Status status;  // a miss: NOT_FOUND, DATA_LOSS, ...
  size_t size = 0;      // record bytes written to the destination
};

class RawGetStream {
 public:
  // Starts the Get call; `context` must outlive the stream.
  RawGetStream(grpc::Channel* channel, grpc::ClientContext* context, const v1::GetRequest& request);

  // Reads the next answer. `destination(index, size)` gives the buffer for a
  // record of `size` bytes (at least that long). Returns false at the end of
  // the stream (then call Finish).
  bool Next(const std::function<std::span<uint8_t>(uint32_t index, size_t size)>& destination,
            RawBlock& block);
  grpc::Status Finish();

  // Parses one GetResponse in wire form; exposed for tests.
  static absl::Status Parse(grpc::ByteBuffer& buffer,
                            const std::function<std::span<uint8_t>(uint32_t, size_t)>& destination,
                            RawBlock& block);

 private:
  std::unique_ptr<grpc::ClientReader<grpc::ByteBuffer>> reader_;
  absl::Status parse_error_;
};

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_RAW_GET_H_
