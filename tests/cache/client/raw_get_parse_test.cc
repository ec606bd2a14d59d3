// The client side of Get parses answers itself (RawGet lands records in the
// caller's buffers without a protobuf copy), so it must hold against any
// bytes a server sends: records land only at their own index, in a slot of
// the right size, whatever the slices look like.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "services/cache/client/raw_get.h"
#include "tests/integration/mangled_messages.h"
#include "tests/test_random.h"

namespace kvtier::cache {
namespace {

constexpr size_t kSlots = 8, kRecord = 1000;

// The bytes as a ByteBuffer of 1 to 8 slices, cut at random.
grpc::ByteBuffer Sliced(const std::string& bytes, std::mt19937_64& rng) {
  std::vector<size_t> cuts = {0, bytes.size()};
  for (size_t n = rng() % 8; n > 0; --n) cuts.push_back(bytes.empty() ? 0 : rng() % bytes.size());
  std::sort(cuts.begin(), cuts.end());
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i + 1 < cuts.size(); ++i) slices.emplace_back(bytes.data() + cuts[i], cuts[i + 1] - cuts[i]);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// kSlots records of kRecord bytes, poisoned, as ShardSet gives them: room
// only for a whole record at an index asked for.
class Slots {
 public:
  Slots() : bytes_(kSlots * kRecord, 0xa5) {}
  RecordDestination Destination() {
    return [this](uint32_t index, size_t size) {
      if (index >= kSlots || size != kRecord) return std::span<uint8_t>();
      return std::span(bytes_).subspan(size_t{index} * kRecord, kRecord);
    };
  }
  std::string Slot(size_t i) const {
    return std::string(reinterpret_cast<const char*>(bytes_.data()) + i * kRecord, kRecord);
  }
  bool Poisoned(size_t i) const { return Slot(i) == std::string(kRecord, '\xa5'); }

 private:
  std::vector<uint8_t> bytes_;
};

v1::GetResponse Answer(uint32_t index, std::mt19937_64& rng) {
  v1::GetResponse r;
  r.set_index(index);
  r.set_block_hash(std::string(32, 'h'));
  std::string data(kRecord, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  r.set_data(data);
  r.set_tier(v1::TIER_HOST);
  return r;
}

absl::Status Parse(const std::string& bytes, Slots& slots, RawBlock& block, std::mt19937_64& rng) {
  grpc::ByteBuffer buffer = Sliced(bytes, rng);
  return ParseRawGetResponse(buffer, slots.Destination(), block);
}

TEST(ParseRawGetResponse, LandsTheRecordAtItsIndexWhateverTheSlices) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  for (int round = 0; round < 200; ++round) {
    const uint32_t index = static_cast<uint32_t>(rng.engine()() % kSlots);  // 0 too: proto3 leaves it out
    const v1::GetResponse answer = Answer(index, rng.engine());
    Slots slots;
    RawBlock block;
    ASSERT_TRUE(Parse(answer.SerializeAsString(), slots, block, rng.engine()).ok());
    EXPECT_EQ(block.index, index);
    EXPECT_EQ(block.tier, v1::TIER_HOST);
    EXPECT_EQ(block.size, kRecord);
    EXPECT_TRUE(block.status.ok());
    EXPECT_EQ(slots.Slot(index), answer.data());
    for (size_t i = 0; i < kSlots; ++i) {
      if (i != index) {
        EXPECT_TRUE(slots.Poisoned(i)) << "slot " << i;
      }
    }
  }
  // A miss: its status, nothing landed.
  v1::GetResponse miss;
  miss.set_index(3);
  miss.mutable_miss()->set_code(static_cast<int32_t>(absl::StatusCode::kNotFound));
  miss.mutable_miss()->set_message("evicted");
  Slots slots;
  RawBlock block;
  ASSERT_TRUE(Parse(miss.SerializeAsString(), slots, block, rng.engine()).ok());
  EXPECT_EQ(block.index, 3u);
  EXPECT_EQ(block.status, absl::NotFoundError("evicted"));
  for (size_t i = 0; i < kSlots; ++i) EXPECT_TRUE(slots.Poisoned(i));
}

// Fields out of order or repeated would land a record under one index and
// report it under another; a length beyond the answer must not allocate it.
TEST(ParseRawGetResponse, RefusesWhatWouldLandUnderAnotherIndex) {
  testing::SeededRng rng;
  const v1::GetResponse answer = Answer(5, rng.engine());
  v1::GetResponse data_only = answer;
  data_only.clear_index();
  v1::GetResponse index_only;
  index_only.set_index(5);
  const std::string data_then_index = data_only.SerializeAsString() + index_only.SerializeAsString();
  const std::string index_twice = index_only.SerializeAsString() + answer.SerializeAsString();
  v1::GetResponse data_again;
  data_again.set_data(answer.data());
  const std::string data_twice = answer.SerializeAsString() + data_again.SerializeAsString();
  // Field 4 (miss), length-delimited, claiming 2^40 bytes.
  const std::string huge_miss = std::string("\x22\x80\x80\x80\x80\x80\x20", 7) + "x";
  for (const std::string& bytes : {data_then_index, index_twice, data_twice, huge_miss}) {
    Slots slots;
    RawBlock block;
    const absl::Status status = Parse(bytes, slots, block, rng.engine());
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  }
}

// Mangled answers: refused, or landed whole in the one slot their index
// names (the others stay poisoned). Run under ASan too.
TEST(ParseRawGetResponse, MangledAnswersLandOnlyInTheirOwnSlot) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  for (int round = 0; round < 2000; ++round) {
    const std::string bytes = kvtier::testing::Mangled(Answer(rng.engine()() % kSlots, rng.engine()), rng.engine());
    Slots slots;
    RawBlock block;
    if (!Parse(bytes, slots, block, rng.engine()).ok()) continue;
    if (block.size == 0) continue;  // a miss
    ASSERT_LT(block.index, kSlots);
    EXPECT_EQ(block.size, kRecord);
    for (size_t i = 0; i < kSlots; ++i) {
      if (i != block.index) {
        EXPECT_TRUE(slots.Poisoned(i)) << "slot " << i << " of an answer for " << block.index;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::cache
