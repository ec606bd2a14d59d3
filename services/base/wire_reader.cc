#include "services/base/wire_reader.h"

#include <algorithm>
#include <cstring>

namespace kvtier {

WireReader::WireReader(Pieces pieces) : pieces_(pieces) {
  for (const std::span<const uint8_t>& piece : pieces) left_ += piece.size();
}

void WireReader::SkipSpent() {
  while (offset_ == pieces_[index_].size()) ++index_, offset_ = 0;
}

bool WireReader::Varint(uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (left_ == 0) return false;
    SkipSpent();
    const uint8_t byte = pieces_[index_][offset_++];
    --left_;
    value |= uint64_t{byte & 0x7fu} << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

bool WireReader::Take(size_t n, std::vector<std::span<const uint8_t>>& out) {
  if (n > left_) return false;
  left_ -= n;
  while (n > 0) {
    SkipSpent();
    const std::span<const uint8_t> piece =
        pieces_[index_].subspan(offset_).first(std::min(n, pieces_[index_].size() - offset_));
    out.push_back(piece);
    n -= piece.size();
    offset_ += piece.size();
  }
  return true;
}

bool WireReader::Read(size_t n, uint8_t* out) {
  if (n > left_) return false;
  left_ -= n;
  while (n > 0) {
    SkipSpent();
    const size_t k = std::min(n, pieces_[index_].size() - offset_);
    if (out != nullptr) {
      std::memcpy(out, pieces_[index_].data() + offset_, k);
      out += k;
    }
    n -= k;
    offset_ += k;
  }
  return true;
}

}  // namespace kvtier
