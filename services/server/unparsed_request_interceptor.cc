#include "services/server/unparsed_request_interceptor.h"

#include <string>

namespace kvtier {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

class UnparsedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit UnparsedRequestInterceptor(const char* method) : method_(method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // The request of a unary or server-streaming call is read (and parsed)
    // before the handler; no message there means it did not parse.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      unparsed_ = true;
    }
    if (unparsed_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS) &&
        !methods->GetSendStatus().ok()) {
      methods->ModifySendStatus(
          grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                       "the request to " + method_ + " does not parse as that method's request message"));
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool unparsed_ = false;
};

}  // namespace

grpc::experimental::Interceptor* UnparsedRequestInterceptorFactory::CreateServerInterceptor(ServerRpcInfo* info) {
  // Streamed requests are read by the handler, whose reads end with no
  // message at the end of the stream: nothing to tell apart there.
  if (info->type() != ServerRpcInfo::Type::UNARY && info->type() != ServerRpcInfo::Type::SERVER_STREAMING) {
    return nullptr;
  }
  return new UnparsedRequestInterceptor(info->method());
}

}  // namespace kvtier
