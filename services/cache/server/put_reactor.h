// kvtier.v1.KvCache's Put stream: slices applied in order on the executor while
// reads run ahead (put_reactor.cc).
#ifndef KVTIER_SERVICES_CACHE_SERVER_PUT_REACTOR_H_
#define KVTIER_SERVICES_CACHE_SERVER_PUT_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/status/statusor.h"
#include "services/cache/server/cache_service.h"
#include "services/rpc/tenants.h"

namespace kvtier::cache {

// The reactor of the Put call `context` serves, by `caller` (or why it may
// not call).
grpc::ServerReadReactor<grpc::ByteBuffer>* NewPutReactor(CacheService* service,
                                                         const grpc::CallbackServerContext* context,
                                                         absl::StatusOr<std::shared_ptr<const Caller>> caller,
                                                         grpc::ByteBuffer* response);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_PUT_REACTOR_H_
