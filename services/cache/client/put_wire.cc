#include "services/cache/client/put_wire.h"

#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>

#include "kvtier/v1/cache.grpc.pb.h"  // protobuf's SerializationTraits, for the answer

namespace kvtier::cache {
namespace {

// Protobuf's tags of the fields written here: (field number << 3) | 2, a
// length-delimited field.
constexpr char kBatchTag = 3 << 3 | 2;   // PutRequest.batch
constexpr char kSliceTag = 1 << 3 | 2;   // SliceBatch.slices
constexpr char kHashTag = 1 << 3 | 2;    // LayerSlice.block_hash
constexpr char kDataTag = 2 << 3 | 2;    // LayerSlice.data
constexpr char kStagedTag = 3 << 3 | 2;  // LayerSlice.staged

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) v >>= 7, ++n;
  return n;
}

void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// A length-delimited field's size on the wire, tag included.
size_t FieldSize(size_t length) { return 1 + VarintSize(length) + length; }

// A slice of gRPC's over `record`'s bytes, which it keeps alive.
grpc::Slice Borrow(std::shared_ptr<const std::string> record) {
  auto* keep = new std::shared_ptr<const std::string>(std::move(record));
  return grpc::Slice(
      const_cast<char*>((*keep)->data()), (*keep)->size(),
      [](void* held) { delete static_cast<std::shared_ptr<const std::string>*>(held); }, keep);
}

}  // namespace

void PutBatchWire::AddInline(const kvblock::BlockHash& hash, std::shared_ptr<const std::string> record) {
  inline_bytes_ += record->size();
  entries_.push_back({std::string(kvblock::HashAsBytes(hash)), std::move(record), {}});
}

void PutBatchWire::AddStaged(const kvblock::BlockHash& hash, const v1::StagedRange& range) {
  entries_.push_back({std::string(kvblock::HashAsBytes(hash)), nullptr, range.SerializeAsString()});
}

grpc::ByteBuffer PutBatchWire::Take() {
  std::vector<size_t> lengths;
  size_t batch = 0;
  for (const Entry& e : entries_) {
    const size_t payload = e.record != nullptr ? e.record->size() : e.staged.size();
    lengths.push_back(FieldSize(e.hash.size()) + FieldSize(payload));
    batch += FieldSize(lengths.back());
  }
  std::vector<grpc::Slice> slices;
  std::string framing;
  framing.push_back(kBatchTag);
  PutVarint(framing, batch);
  for (size_t i = 0; i < entries_.size(); ++i) {
    Entry& e = entries_[i];
    framing.push_back(kSliceTag);
    PutVarint(framing, lengths[i]);
    framing.push_back(kHashTag);
    PutVarint(framing, e.hash.size());
    framing += e.hash;
    if (e.record == nullptr) {
      framing.push_back(kStagedTag);
      PutVarint(framing, e.staged.size());
      framing += e.staged;
      continue;
    }
    framing.push_back(kDataTag);
    PutVarint(framing, e.record->size());
    if (e.record->size() < kCopyBelowBytes) {
      framing += *e.record;
      continue;
    }
    slices.emplace_back(framing);
    framing.clear();
    slices.push_back(Borrow(std::move(e.record)));
  }
  if (!framing.empty()) slices.emplace_back(framing);
  entries_.clear();
  inline_bytes_ = 0;
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer PutHeaderMessage(const v1::PutHeader& header) {
  v1::PutRequest request;
  *request.mutable_header() = header;
  const grpc::Slice bytes(request.SerializeAsString());
  return grpc::ByteBuffer(&bytes, 1);
}

std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> OpenRawPut(grpc::Channel* channel, grpc::ClientContext* context,
                                                                 v1::PutResponse* response) {
  // As the generated stub opens it, but for messages already in wire form.
  static const grpc::internal::RpcMethod kPut("/kvtier.v1.KvCache/Put", grpc::internal::RpcMethod::CLIENT_STREAMING);
  return std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>>(
      grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(channel, kPut, context, response));
}

}  // namespace kvtier::cache
