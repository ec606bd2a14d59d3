#include "services/cache/server/put_message.h"

#include <algorithm>

namespace kvtier::cache {
namespace {

// Protobuf's wire format over bytes in pieces. Every read fails (false)
// rather than run past the end.
class PieceReader {
 public:
  PieceReader(std::span<const std::span<const uint8_t>> pieces, size_t size) : pieces_(pieces), left_(size) {}

  bool done() const { return left_ == 0; }

  bool Varint(uint64_t& value) {
    value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t byte;
      if (!Byte(byte)) return false;
      value |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;
  }

  // The next `n` bytes, as views into the pieces.
  bool Take(size_t n, std::vector<std::span<const uint8_t>>& out) {
    if (n > left_) return false;
    left_ -= n;
    while (n > 0) {
      SkipSpent();
      const std::span<const uint8_t> piece = pieces_[index_].subspan(offset_);
      const size_t k = std::min(n, piece.size());
      out.push_back(piece.first(k));
      n -= k;
      offset_ += k;
    }
    return true;
  }

  // A length-delimited field's bytes as a reader of their own.
  bool Sub(size_t n, std::vector<std::span<const uint8_t>>& storage, PieceReader& sub) {
    storage.clear();
    if (!Take(n, storage)) return false;
    sub = PieceReader(storage, n);
    return true;
  }

  bool Copy(size_t n, std::string& out) {
    std::vector<std::span<const uint8_t>> parts;
    if (!Take(n, parts)) return false;
    out.clear();
    for (const auto& p : parts) out.append(reinterpret_cast<const char*>(p.data()), p.size());
    return true;
  }

 private:
  bool Byte(uint8_t& byte) {
    if (left_ == 0) return false;
    SkipSpent();
    byte = pieces_[index_][offset_++];
    --left_;
    return true;
  }
  // To the piece of the next byte; there is one.
  void SkipSpent() {
    while (offset_ == pieces_[index_].size()) ++index_, offset_ = 0;
  }

  std::span<const std::span<const uint8_t>> pieces_;
  size_t index_ = 0;
  size_t offset_ = 0;
  size_t left_;
};

constexpr uint32_t kLengthDelimited = 2;

// A length-delimited field's number and length; false at anything else.
bool Field(PieceReader& in, uint32_t& number, uint64_t& length) {
  uint64_t tag;
  if (!in.Varint(tag) || (tag & 7) != kLengthDelimited || (tag >> 3) == 0 || (tag >> 3) > UINT32_MAX) return false;
  number = static_cast<uint32_t>(tag >> 3);
  return in.Varint(length);
}

// One LayerSlice whose fields each appear once: block_hash (1) and one of
// data (2) or staged (3).
bool LayerSlice(PieceReader& in, PutSliceView& out) {
  bool hash = false, data = false;
  while (!in.done()) {
    uint32_t number;
    uint64_t length;
    if (!Field(in, number, length)) return false;
    if (number == 1 && !hash) {
      if (!in.Copy(length, out.block_hash)) return false;
      hash = true;
    } else if (number == 2 && !data && !out.staged) {
      if (!in.Take(length, out.data)) return false;
      data = true;
    } else if (number == 3 && !data && !out.staged) {
      std::string bytes;
      if (!in.Copy(length, bytes)) return false;
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
  size_t size = 0;
  for (const grpc::Slice& s : message) {
    pieces.emplace_back(s.begin(), s.size());
    size += s.size();
  }
  PieceReader in(pieces, size);
  uint32_t number;
  uint64_t length;
  // One field: a slice (2) or a batch (3) of slices (field 1 each).
  if (!Field(in, number, length) || (number != 2 && number != 3)) return std::nullopt;
  std::vector<std::span<const uint8_t>> body_pieces, slice_pieces;
  PieceReader body({}, 0);
  if (!in.Sub(length, body_pieces, body) || !in.done()) return std::nullopt;
  std::vector<PutSliceView> slices;
  if (number == 2) {
    if (!LayerSlice(body, slices.emplace_back())) return std::nullopt;
    return slices;
  }
  while (!body.done() && slices.size() <= max_slices) {
    PieceReader slice({}, 0);
    if (!Field(body, number, length) || number != 1 || !body.Sub(length, slice_pieces, slice)) return std::nullopt;
    if (!LayerSlice(slice, slices.emplace_back())) return std::nullopt;
  }
  return slices;
}

}  // namespace kvtier::cache
