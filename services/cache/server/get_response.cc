#include "services/cache/server/get_response.h"

#include <grpcpp/impl/codegen/proto_utils.h>

#include <string>
#include <vector>

namespace kvtier::cache {
namespace {

// Protobuf wire format: tag = field number << 3 | wire type.
constexpr uint8_t kVarint = 0, kLengthDelimited = 2;
constexpr uint8_t Tag(int field, uint8_t type) { return static_cast<uint8_t>(field << 3 | type); }

void AppendVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void ReleasePin(void* holder) { delete static_cast<std::shared_ptr<const PinnedBlock>*>(holder); }

}  // namespace

grpc::ByteBuffer EncodeBlockResponse(uint32_t index, const kvblock::BlockHash& hash,
                                     const std::shared_ptr<const PinnedBlock>& block) {
  // Field numbers from cache.proto's GetResponse.
  std::string header;
  header.push_back(static_cast<char>(Tag(v1::GetResponse::kIndexFieldNumber, kVarint)));
  AppendVarint(header, index);
  header.push_back(static_cast<char>(Tag(v1::GetResponse::kBlockHashFieldNumber, kLengthDelimited)));
  AppendVarint(header, hash.size());
  header.append(kvblock::HashAsBytes(hash));
  header.push_back(static_cast<char>(Tag(v1::GetResponse::kTierFieldNumber, kVarint)));
  AppendVarint(header, static_cast<uint64_t>(block->tier()));
  header.push_back(static_cast<char>(Tag(v1::GetResponse::kDataFieldNumber, kLengthDelimited)));
  AppendVarint(header, block->size());

  std::vector<grpc::Slice> slices;
  slices.reserve(block->pieces().size() + 1);
  slices.emplace_back(header);
  for (const auto& piece : block->pieces()) {
    slices.emplace_back(const_cast<uint8_t*>(piece.data()), piece.size(), &ReleasePin,
                        new std::shared_ptr<const PinnedBlock>(block));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer EncodeResponse(const v1::GetResponse& response) {
  grpc::ByteBuffer buffer;
  bool own = false;
  // Serializing a well-formed message into a fresh buffer cannot fail.
  (void)grpc::SerializationTraits<v1::GetResponse>::Serialize(response, &buffer, &own);
  return buffer;
}

}  // namespace kvtier::cache
