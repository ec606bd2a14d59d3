// Protobuf's wire format read over a message that lies in pieces (gRPC's
// receive buffers), without gathering them first: varints, and bytes as
// views into the pieces, copied out, or skipped. Every read fails (false)
// rather than run past the end. The pieces must outlive the reader and
// the views it gives.
#ifndef KVTIER_SERVICES_BASE_WIRE_READER_H_
#define KVTIER_SERVICES_BASE_WIRE_READER_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvtier {

class WireReader {
 public:
  using Pieces = std::span<const std::span<const uint8_t>>;

  WireReader() = default;
  explicit WireReader(Pieces pieces);

  bool done() const { return left_ == 0; }
  size_t remaining() const { return left_; }

  bool Varint(uint64_t& value);
  // The next `n` bytes, appended to `out` as views into the pieces.
  bool Take(size_t n, std::vector<std::span<const uint8_t>>& out);
  // Copies the next `n` bytes to `out`, or skips them when it is null.
  bool Read(size_t n, uint8_t* out);

 private:
  // To the piece of the next byte; call only while bytes are left.
  void SkipSpent();

  Pieces pieces_;
  size_t index_ = 0;
  size_t offset_ = 0;
  size_t left_ = 0;
};

}  // namespace kvtier

#endif  // KVTIER_SERVICES_BASE_WIRE_READER_H_
