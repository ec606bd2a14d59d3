// Reads a Get stream as raw bytes and lands each block's record straight in
// a caller's buffer: the record is copied once, from gRPC's receive buffers
// to its destination, never through a protobuf string. For readers that
// keep blocks in their own memory (the decode worker's pool, benchmarks).
#ifndef KVTIER_SERVICES_CACHE_CLIENT_RAW_GET_H_
#define KVTIER_SERVICES_CACHE_CLIENT_RAW_GET_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "kvtier/v1/cache.pb.h"

namespace kvtier::cache {

struct RawBlock {
  uint32_t index = 0;
  v1::Tier tier = v1::TIER_UNSPECIFIED;
  absl::Status status;  // a miss: NOT_FOUND, DATA_LOSS, ...
  size_t size = 0;      // record bytes written to the destination
};

using RecordDestination = std::function<std::span<uint8_t>(uint32_t index, size_t size)>;

// Runs one Get call to the end. Answers are received on a thread of the
// call's own and landed on the caller's, in order, while the next ones
// arrive: each record is copied into `destination(index, size)` (a buffer
// at least `size` long), then `on_block` sees what arrived. Blocks the
// caller until the stream ends and returns its status (INTERNAL if an
// answer did not parse).
grpc::Status RawGet(grpc::Channel* channel, grpc::ClientContext* context, const v1::GetRequest& request,
                    const RecordDestination& destination, const std::function<void(const RawBlock&)>& on_block);

// Parses one GetResponse in wire form; exposed for tests.
absl::Status ParseRawGetResponse(grpc::ByteBuffer& buffer, const RecordDestination& destination, RawBlock& block);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_CLIENT_RAW_GET_H_
