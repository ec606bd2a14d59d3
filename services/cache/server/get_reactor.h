// kvtier.v1.KvCache's Get stream: blocks written in order straight from the
// store's pages, one write in flight (get_reactor.cc).
#ifndef KVTIER_SERVICES_CACHE_SERVER_GET_REACTOR_H_
#define KVTIER_SERVICES_CACHE_SERVER_GET_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/statusor.h"
#include "services/cache/server/cache_service.h"
#include "services/rpc/tenants.h"

namespace kvtier::cache {

// The reactor of the Get call `context` serves, by `caller` (or why it may
// not call).
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewGetReactor(CacheService* service,
                                                          const grpc::CallbackServerContext* context,
                                                          absl::StatusOr<std::shared_ptr<const Caller>> caller,
                                                          const grpc::ByteBuffer* request);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_GET_REACTOR_H_
