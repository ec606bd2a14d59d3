// The kvtier.v1 contract as later services will implement it: the RPCs, their
// streaming kinds, and that messages round-trip through the wire format.
#include <gtest/gtest.h>

#include "kvtier/v1/cache.grpc.pb.h"
#include "kvtier/v1/decode.grpc.pb.h"
#include "kvtier/v1/prefill.grpc.pb.h"

namespace kvtier::v1 {
namespace {

struct Rpc {
  std::string service, method;
  bool client_streaming, server_streaming;
};

TEST(Contract, ServicesHaveTheRpcsAndStreamingKinds) {
  const std::vector<Rpc> rpcs = {
      {"kvtier.v1.KvCache", "Match", false, false},   {"kvtier.v1.KvCache", "Put", true, false},
      {"kvtier.v1.KvCache", "Get", false, true},      {"kvtier.v1.KvCache", "ReleaseLease", false, false},
      {"kvtier.v1.KvCache", "Stats", false, false},   {"kvtier.v1.Decode", "Decode", false, true},
      {"kvtier.v1.Prefill", "Generate", false, true},
  };
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const Rpc& rpc : rpcs) {
    const auto* service = pool->FindServiceByName(rpc.service);
    ASSERT_NE(service, nullptr) << rpc.service;
    const auto* method = service->FindMethodByName(rpc.method);
    ASSERT_NE(method, nullptr) << rpc.service << "." << rpc.method;
    EXPECT_EQ(method->client_streaming(), rpc.client_streaming) << rpc.method;
    EXPECT_EQ(method->server_streaming(), rpc.server_streaming) << rpc.method;
  }
}

TEST(Contract, DecodeRequestRoundTrips) {
  DecodeRequest req;
  req.set_request_id("r1");
  req.set_kv_namespace("tenant");
  req.mutable_layout()->set_codec(KV_CODEC_INT4);
  for (uint32_t t : {1u, 2u, 3u}) req.add_token_ids(t);
  req.add_block_hashes(std::string(32, '\x7f'));
  req.mutable_tail()->set_token_count(3);
  req.mutable_tail()->set_latents(std::string(12, '\0'));
  req.mutable_first_token()->set_token_id(9);
  req.mutable_sampling()->set_temperature(0.7f);
  req.mutable_limits()->set_max_new_tokens(16);
  req.mutable_limits()->set_top_logprobs(5);
  const std::string wire = req.SerializeAsString();
  DecodeRequest back;
  ASSERT_TRUE(back.ParseFromString(wire));
  EXPECT_EQ(back.SerializeAsString(), wire);
  EXPECT_EQ(back.layout().codec(), KV_CODEC_INT4);
  EXPECT_EQ(back.first_token().token_id(), 9u);
  EXPECT_EQ(back.tail().latents().size(), 12u);
}

TEST(Contract, StreamedEventsAreOneOfTokenOrFinished) {
  GenerateResponse token, done;
  token.mutable_token()->set_token_id(5);
  done.mutable_finished()->set_reason(FINISH_REASON_LENGTH);
  done.mutable_finished()->mutable_usage()->set_cached_tokens(64);
  EXPECT_EQ(token.event_case(), GenerateResponse::kToken);
  EXPECT_EQ(done.event_case(), GenerateResponse::kFinished);
  PutRequest put;
  put.mutable_header()->set_kv_namespace("t");
  put.mutable_slice()->set_data("x");  // setting one member clears the other
  EXPECT_EQ(put.kind_case(), PutRequest::kSlice);
}

}  // namespace
}  // namespace kvtier::v1
