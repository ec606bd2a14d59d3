#include "services/cli/remote_generate.h"

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "kvtier/v1/prefill.grpc.pb.h"
#include "services/cache/client/cache_client.h"
#include "services/rpc/client_identity.h"
#include "services/rpc/grpc_status.h"

namespace kvtier::cli {

absl::StatusOr<RemoteGeneration> GenerateRemotely(const std::string& target, const v1::GenerateRequest& request,
                                                  absl::Duration deadline) {
  auto stub = v1::Prefill::NewStub(MakeChannel(target));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  auto reader = stub->Generate(&context, request);
  RemoteGeneration out;
  v1::GenerateResponse event;
  while (reader->Read(&event)) {
    if (event.has_token()) {
      runtime::Sampled s;
      s.token = event.token().token_id();
      s.logprob = event.token().logprob();
      for (const v1::TopLogprob& t : event.token().top_logprobs()) s.top.emplace_back(t.token_id(), t.logprob());
      out.tokens.push_back(std::move(s));
    } else if (event.has_finished()) {
      out.reason = event.finished().reason();
      out.usage = event.finished().usage();
    }
  }
  if (grpc::Status s = reader->Finish(); !s.ok()) return FromGrpcStatus(s);
  if (out.reason == v1::FINISH_REASON_UNSPECIFIED) {
    return absl::UnavailableError(absl::StrCat("the prefill node at ", target, " ended the stream without finishing"));
  }
  return out;
}

absl::StatusOr<v1::ServerInfo> PrefillInfo(const std::string& target, absl::Duration deadline) {
  auto stub = v1::Prefill::NewStub(MakeChannel(target));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
  v1::ServerInfo info;
  if (grpc::Status s = stub->Info(&context, v1::InfoRequest(), &info); !s.ok()) return FromGrpcStatus(s);
  return info;
}

}  // namespace kvtier::cli
