// ParseRawGetResponse, a client's own read of a Get answer from any server
// (RawGet lands records straight in the caller's buffers): a record lands
// only in the slot its index names, and only when it fits that slot;
// nothing else is written; what it reads as a record is what protobuf
// reads as the answer's data. Input: the length of the pieces the answer
// arrives in (1-64 bytes), then the answer.
#include <algorithm>
#include <string>
#include <vector>

#include "services/cache/client/raw_get.h"
#include "tests/fuzz/fuzz_target.h"

namespace kvtier::fuzz {
namespace {

// Slots of kRecord bytes each, as ShardSet offers them: room only for a
// whole record at an index asked for.
constexpr size_t kSlots = 4, kRecord = 48;
constexpr uint8_t kPoison = 0xa5;

}  // namespace

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  const auto add = [&](const v1::GetResponse& answer) { seeds.push_back("\x05" + answer.SerializeAsString()); };
  v1::GetResponse data;
  data.set_index(2);
  data.set_block_hash(std::string(32, 'h'));
  data.set_data(std::string(kRecord, 'd'));
  data.set_tier(v1::TIER_HOST);
  add(data);
  v1::GetResponse miss;
  miss.set_index(1);
  miss.set_block_hash(std::string(32, 'm'));
  miss.mutable_miss()->set_code(5);
  miss.mutable_miss()->set_message("not stored");
  add(miss);
  v1::GetResponse first;  // index 0: proto3 leaves it out
  first.set_data(std::string(kRecord, 'f'));
  add(first);
  return seeds;
}

}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  using fuzz::kPoison, fuzz::kRecord, fuzz::kSlots;
  if (size < 1) return 0;
  const size_t piece = 1 + data[0] % 64;
  const std::string wire(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < wire.size(); at += piece)
    slices.emplace_back(wire.data() + at, std::min(piece, wire.size() - at));
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  std::vector<uint8_t> slots(kSlots * kRecord, kPoison);
  int offered = -1;
  const cache::RecordDestination destination = [&](uint32_t index, size_t bytes) {
    KVTIER_FUZZ_CHECK(offered < 0);  // one record an answer
    if (index >= kSlots || bytes != kRecord) return std::span<uint8_t>();
    offered = static_cast<int>(index);
    return std::span(slots).subspan(size_t{index} * kRecord, kRecord);
  };
  cache::RawBlock block;
  const absl::Status status = cache::ParseRawGetResponse(buffer, destination, block);
  for (size_t i = 0; i < kSlots; ++i) {
    if (static_cast<int>(i) == offered) continue;
    KVTIER_FUZZ_CHECK(std::all_of(slots.begin() + i * kRecord, slots.begin() + (i + 1) * kRecord,
                                  [](uint8_t b) { return b == kPoison; }));
  }
  if (!status.ok() || block.size == 0) return 0;
  KVTIER_FUZZ_CHECK(offered >= 0 && block.index == static_cast<uint32_t>(offered) && block.size == kRecord);
  v1::GetResponse answer;
  if (answer.ParseFromString(wire) && answer.has_data()) {
    const std::string landed(slots.begin() + offered * kRecord, slots.begin() + (offered + 1) * kRecord);
    KVTIER_FUZZ_CHECK(answer.index() == block.index && answer.data() == landed);
  }
  return 0;
}
