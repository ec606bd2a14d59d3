// ParsePutSlices against protobuf's own parse: the same slices for every
// message it reads, on random messages cut at random places, and nothing it
// reads that protobuf would not.
#include "services/cache/server/put_message.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

std::string RandomBytes(size_t n, std::mt19937_64& rng) {
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

v1::LayerSlice RandomSlice(std::mt19937_64& rng) {
  v1::LayerSlice slice;
  slice.set_block_hash(RandomBytes(32, rng));
  if (rng() % 4 == 0) {
    slice.mutable_staged()->set_offset(rng() % 100000);
    slice.mutable_staged()->set_length(rng() % 100000);
  } else {
    slice.set_data(RandomBytes(rng() % 3000, rng));
  }
  return slice;
}

v1::PutRequest RandomRequest(std::mt19937_64& rng) {
  v1::PutRequest request;
  if (rng() % 3 == 0) {
    *request.mutable_slice() = RandomSlice(rng);
  } else {
    v1::SliceBatch& batch = *request.mutable_batch();  // set, even with no slices
    const int n = static_cast<int>(rng() % 20);
    for (int i = 0; i < n; ++i) *batch.add_slices() = RandomSlice(rng);
  }
  return request;
}

// `wire` cut at random places, as gRPC's receive buffers hold a message.
std::vector<grpc::Slice> Cut(const std::string& wire, std::mt19937_64& rng) {
  std::vector<grpc::Slice> pieces;
  size_t at = 0;
  while (at < wire.size()) {
    const size_t n = std::min<size_t>(wire.size() - at, 1 + rng() % 700);
    pieces.emplace_back(wire.data() + at, n);
    at += n;
  }
  if (rng() % 2 == 0) pieces.emplace_back();  // an empty slice at the end
  return pieces;
}

std::string Joined(const std::vector<std::span<const uint8_t>>& pieces) {
  std::string s;
  for (const auto& p : pieces) s.append(reinterpret_cast<const char*>(p.data()), p.size());
  return s;
}

// What protobuf reads from `wire`, as the views should hold it.
void ExpectSameAsProtobuf(const std::string& wire, const std::vector<PutSliceView>& got) {
  v1::PutRequest request;
  ASSERT_TRUE(request.ParseFromString(wire)) << "read a message protobuf refuses";
  std::vector<const v1::LayerSlice*> want;
  if (request.has_slice()) want.push_back(&request.slice());
  for (const v1::LayerSlice& s : request.batch().slices()) want.push_back(&s);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].block_hash, want[i]->block_hash()) << i;
    EXPECT_EQ(got[i].staged.has_value(), want[i]->has_staged()) << i;
    if (want[i]->has_staged()) {
      EXPECT_EQ(got[i].staged->offset(), want[i]->staged().offset()) << i;
      EXPECT_EQ(got[i].staged->length(), want[i]->staged().length()) << i;
    } else {
      EXPECT_EQ(Joined(got[i].data), want[i]->data()) << i;
    }
  }
}

TEST(PutMessage, ReadsWhatProtobufReadsWhereverTheMessageIsCut) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  for (int round = 0; round < 300; ++round) {
    const std::string wire = RandomRequest(rng.engine()).SerializeAsString();
    const std::vector<grpc::Slice> message = Cut(wire, rng.engine());  // the views point into it
    std::optional<std::vector<PutSliceView>> got = ParsePutSlices(message, 4096);
    ASSERT_TRUE(got.has_value()) << "round " << round;
    ExpectSameAsProtobuf(wire, *got);
  }
}

// Damaged messages: whatever it reads, protobuf reads the same; it never
// runs past the message.
TEST(PutMessage, ReadsNothingProtobufWouldNot) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  int declined = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string wire = RandomRequest(rng.engine()).SerializeAsString();
    if (wire.empty()) continue;
    switch (rng.engine()() % 3) {
      case 0:
        wire.resize(rng.engine()() % wire.size());
        break;
      case 1:
        wire[rng.engine()() % wire.size()] ^= static_cast<char>(1 << (rng.engine()() % 8));
        break;
      default:
        wire.insert(rng.engine()() % wire.size(), RandomBytes(1 + rng.engine()() % 4, rng.engine()));
    }
    const std::vector<grpc::Slice> message = Cut(wire, rng.engine());
    std::optional<std::vector<PutSliceView>> got = ParsePutSlices(message, 4096);
    if (!got.has_value()) {
      ++declined;
      continue;
    }
    ExpectSameAsProtobuf(wire, *got);
  }
  EXPECT_GT(declined, 100);
}

// What it leaves to protobuf: a header, unknown and repeated fields.
TEST(PutMessage, LeavesEverythingElseToProtobuf) {
  v1::PutRequest header;
  header.mutable_header()->set_kv_namespace("tenant");
  EXPECT_FALSE(ParsePutSlices({grpc::Slice(header.SerializeAsString())}, 4096).has_value());

  v1::PutRequest slice;
  slice.mutable_slice()->set_block_hash(std::string(32, 'h'));
  slice.mutable_slice()->set_data("record");
  const std::string wire = slice.SerializeAsString();
  ASSERT_TRUE(ParsePutSlices({grpc::Slice(wire)}, 4096).has_value());
  EXPECT_FALSE(ParsePutSlices({grpc::Slice(wire + wire)}, 4096).has_value()) << "two top-level fields";

  v1::LayerSlice twice;
  twice.set_block_hash(std::string(32, 'h'));
  std::string inner = twice.SerializeAsString() + twice.SerializeAsString();  // block_hash twice
  std::string outer = std::string("\x12") + static_cast<char>(inner.size()) + inner;
  EXPECT_FALSE(ParsePutSlices({grpc::Slice(outer)}, 4096).has_value());

  std::string unknown = twice.SerializeAsString() + std::string("\x20\x01");  // field 4, a varint
  outer = std::string("\x12") + static_cast<char>(unknown.size()) + unknown;
  EXPECT_FALSE(ParsePutSlices({grpc::Slice(outer)}, 4096).has_value());
}

TEST(PutMessage, StopsReadingABatchPastItsLimit) {
  v1::PutRequest batch;
  for (int i = 0; i < 50; ++i) batch.mutable_batch()->add_slices()->set_block_hash("h");
  std::optional<std::vector<PutSliceView>> got = ParsePutSlices({grpc::Slice(batch.SerializeAsString())}, 10);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->size(), 11u);
}

}  // namespace
}  // namespace kvtier::cache
