#include "services/cache/server/put_message.h"

#include "services/base/wire_reader.h"

namespace kvtier::cache {
namespace {

// A length-delimited field's `n` bytes as a reader of their own, over
// views kept in `storage`.
bool Sub(WireReader& in, size_t n, std::vector<std::span<const uint8_t>>& storage, WireReader& sub) {
  storage.clear();
  if (!in.Take(n, storage)) return false;
  sub = WireReader(storage);
  return true;
}

bool Copy(WireReader& in, size_t n, std::string& out) {
  if (n > in.remaining()) return false;
  out.resize(n);
  return in.Read(n, reinterpret_cast<uint8_t*>(out.data()));
}

constexpr uint32_t kLengthDelimited = 2;

// A length-delimited field's number and length; false at anything else.
bool Field(WireReader& in, uint32_t& number, uint64_t& length) {
  uint64_t tag;
  if (!in.Varint(tag) || (tag & 7) != kLengthDelimited || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX) return false;
  number = static_cast<uint32_t>(tag >> 3);
  return in.Varint(length);
}

// One LayerSlice whose fields each appear once: block_hash (1) and one of
// data (2) or staged (3).
bool LayerSlice(WireReader& in, PutSliceView& out) {
  bool hash = false, data = false;
  while (!in.done()) {
    uint32_t number;
    uint64_t length;
    if (!Field(in, number, length)) return false;
    if (number == 1 && !hash) {
      if (!Copy(in, length, out.block_hash)) return false;
      hash = true;
    } else if (number == 2 && !data && !out.staged) {
      if (!in.Take(length, out.data)) return false;
      data = true;
    } else if (number == 3 && !data && !out.staged) {
      std::string bytes;
      if (!Copy(in, length, bytes)) return false;
      if (!out.staged.emplace().ParseFromString(bytes)) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace

std::optional<std::vector<PutSliceView>> ParsePutSlices(const std::vector<grpc::Slice>& message, size_t max_slices) {
  std::vector<std::span<const uint8_t>> pieces;
  for (const grpc::Slice& s : message) pieces.emplace_back(s.begin(), s.size());
  WireReader in(pieces);
  uint32_t number;
  uint64_t length;
  // One field: a slice (2) or a batch (3) of slices (field 1 each).
  if (!Field(in, number, length) || (number != 2 && number != 3)) return std::nullopt;
  std::vector<std::span<const uint8_t>> body_pieces, slice_pieces;
  WireReader body;
  if (!Sub(in, length, body_pieces, body) || !in.done()) return std::nullopt;
  std::vector<PutSliceView> slices;
  if (number == 2) {
    if (!LayerSlice(body, slices.emplace_back())) return std::nullopt;
    return slices;
  }
  while (!body.done() && slices.size() <= max_slices) {
    WireReader slice;
    if (!Field(body, number, length) || number != 1 || !Sub(body, length, slice_pieces, slice)) return std::nullopt;
    if (!LayerSlice(slice, slices.emplace_back())) return std::nullopt;
  }
  return slices;
}

}  // namespace kvtier::cache
