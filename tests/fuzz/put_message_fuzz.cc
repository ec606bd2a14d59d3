// ParsePutSlices, the cache's own read of a Put message from any client,
// against protobuf's parse of the same bytes: whatever it reads, protobuf
// reads the same, and it reads no further than a batch's first
// max_slices + 1 slices. Input: the length of the pieces the message
// arrives in (1-64 bytes), max_slices (0-31), then the message.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "services/cache/server/put_message.h"
#include "tests/fuzz/fuzz_target.h"

namespace kvtier::fuzz {
namespace {

std::string Joined(const std::vector<std::span<const uint8_t>>& pieces) {
  std::string s;
  for (const auto& p : pieces) s.append(reinterpret_cast<const char*>(p.data()), p.size());
  return s;
}

v1::LayerSlice Slice(char fill, size_t data_bytes) {
  v1::LayerSlice slice;
  slice.set_block_hash(std::string(32, fill));
  slice.set_data(std::string(data_bytes, fill));
  return slice;
}

}  // namespace

std::vector<std::string> Seeds() {
  std::vector<std::string> seeds;
  const auto add = [&](const v1::PutRequest& request) {
    seeds.push_back(std::string("\x07\x04", 2) + request.SerializeAsString());
  };
  v1::PutRequest one;
  *one.mutable_slice() = Slice('a', 100);
  add(one);
  v1::PutRequest staged;
  staged.mutable_slice()->set_block_hash(std::string(32, 's'));
  staged.mutable_slice()->mutable_staged()->set_offset(4096);
  staged.mutable_slice()->mutable_staged()->set_length(1 << 20);
  add(staged);
  v1::PutRequest batch;
  for (char c : {'x', 'y', 'z'}) *batch.mutable_batch()->add_slices() = Slice(c, 40);
  add(batch);
  v1::PutRequest header;
  header.mutable_header()->set_kv_namespace("tenant-a");
  header.mutable_header()->set_cold_start(true);
  add(header);
  return seeds;
}

}  // namespace kvtier::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  if (size < 2) return 0;
  const size_t piece = 1 + data[0] % 64, max_slices = data[1] % 32;
  const std::string wire(reinterpret_cast<const char*>(data) + 2, size - 2);
  std::vector<grpc::Slice> message;
  for (size_t at = 0; at < wire.size(); at += piece) {
    message.emplace_back(wire.data() + at, std::min(piece, wire.size() - at));
  }
  const std::optional<std::vector<cache::PutSliceView>> got = cache::ParsePutSlices(message, max_slices);
  if (!got.has_value()) return 0;
  KVTIER_FUZZ_CHECK(got->size() <= max_slices + 1);
  // A batch of more than max_slices is read no further than one past them
  // (and refused by the caller): its rest may be anything.
  const bool cut_short = wire[0] == 0x1a && got->size() == max_slices + 1;  // field 3, a batch
  v1::PutRequest request;
  const bool parsed = request.ParseFromString(wire);
  KVTIER_FUZZ_CHECK(parsed || cut_short);
  if (!parsed) return 0;
  std::vector<const v1::LayerSlice*> want;
  if (request.has_slice()) want.push_back(&request.slice());
  for (const v1::LayerSlice& s : request.batch().slices()) want.push_back(&s);
  KVTIER_FUZZ_CHECK(got->size() == want.size() || (cut_short && got->size() < want.size()));
  for (size_t i = 0; i < got->size(); ++i) {
    const cache::PutSliceView& view = (*got)[i];
    KVTIER_FUZZ_CHECK(view.block_hash == want[i]->block_hash());
    KVTIER_FUZZ_CHECK(view.staged.has_value() == want[i]->has_staged());
    if (view.staged) {
      KVTIER_FUZZ_CHECK(view.staged->offset() == want[i]->staged().offset());
      KVTIER_FUZZ_CHECK(view.staged->length() == want[i]->staged().length());
    } else {
      KVTIER_FUZZ_CHECK(fuzz::Joined(view.data) == want[i]->data());
    }
  }
  return 0;
}
