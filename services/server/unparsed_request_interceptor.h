// gRPC answers a request whose bytes do not parse as the method's message
// before any handler runs: UNIMPLEMENTED from a callback handler, INTERNAL
// from a synchronous one, both without a message, so a client would look
// for a missing method or a server bug. This server interceptor notices the
// failed parse and makes that answer INVALID_ARGUMENT, naming the method.
#ifndef KVTIER_SERVICES_SERVER_UNPARSED_REQUEST_INTERCEPTOR_H_
#define KVTIER_SERVICES_SERVER_UNPARSED_REQUEST_INTERCEPTOR_H_

#include <grpcpp/support/server_interceptor.h>

namespace kvtier {

class UnparsedRequestInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_SERVER_UNPARSED_REQUEST_INTERCEPTOR_H_
