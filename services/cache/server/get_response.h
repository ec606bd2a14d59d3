// Get answers written straight from the store's pages: the GetResponse wire
// bytes are a small header slice followed by slices that point into the
// pinned block's pages, so a block goes from cache memory to the socket
// without being copied into a protobuf string first. The slices keep the
// block pinned until gRPC lets go of them.
#ifndef KVTIER_SERVICES_CACHE_SERVER_GET_RESPONSE_H_
#define KVTIER_SERVICES_CACHE_SERVER_GET_RESPONSE_H_

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "kvtier/v1/cache.pb.h"
#include "services/cache/store/block_store.h"
#include "services/kvblock/block_key.h"

namespace kvtier::cache {

// A GetResponse carrying the whole pinned record as `data`.
grpc::ByteBuffer EncodeBlockResponse(uint32_t index, const kvblock::BlockHash& hash,
                                     const std::shared_ptr<const PinnedBlock>& block);

// Any other GetResponse (a miss, or a layer subset), serialized normally.
grpc::ByteBuffer EncodeResponse(const v1::GetResponse& response);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_GET_RESPONSE_H_
