// PutBatchWire against protobuf: its messages parse as the PutRequest
// protobuf would have built from the same slices, whatever their sizes.
#include "services/cache/client/put_wire.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

std::string AsString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string s;
  for (const grpc::Slice& slice : slices) s.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  return s;
}

TEST(PutWire, BatchesParseAsTheProtobufBuiltFromTheSameSlices) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  auto& engine = rng.engine();
  for (int round = 0; round < 100; ++round) {
    PutBatchWire wire;
    v1::PutRequest want;
    want.mutable_batch();
    const int n = static_cast<int>(engine() % 12);
    size_t inline_bytes = 0;
    for (int i = 0; i < n; ++i) {
      kvblock::BlockHash hash;
      for (uint8_t& b : hash) b = static_cast<uint8_t>(engine());
      v1::LayerSlice& slice = *want.mutable_batch()->add_slices();
      slice.set_block_hash(std::string(kvblock::HashAsBytes(hash)));
      if (engine() % 4 == 0) {
        slice.mutable_staged()->set_offset(engine() % (1u << 30));
        slice.mutable_staged()->set_length(engine() % (1u << 20));
        wire.AddStaged(hash, slice.staged());
        continue;
      }
      // Both sides of kCopyBelowBytes.
      std::string record(engine() % (3 * PutBatchWire::kCopyBelowBytes), '\0');
      for (char& c : record) c = static_cast<char>(engine());
      slice.set_data(record);
      inline_bytes += record.size();
      wire.AddInline(hash, std::make_shared<const std::string>(std::move(record)));
    }
    EXPECT_EQ(wire.slices(), static_cast<size_t>(n));
    EXPECT_EQ(wire.inline_bytes(), inline_bytes);
    v1::PutRequest got;
    ASSERT_TRUE(got.ParseFromString(AsString(wire.Take()))) << "round " << round;
    EXPECT_EQ(got.SerializeAsString(), want.SerializeAsString()) << "round " << round;
    EXPECT_EQ(wire.slices(), 0u);
  }
}

TEST(PutWire, HeaderIsThePutRequestsHeader) {
  v1::PutHeader header;
  header.set_kv_namespace("tenant");
  header.set_fast_path_session_id(42);
  v1::PutRequest got;
  ASSERT_TRUE(got.ParseFromString(AsString(PutHeaderMessage(header))));
  EXPECT_EQ(got.header().SerializeAsString(), header.SerializeAsString());
}

}  // namespace
}  // namespace kvtier::cache
