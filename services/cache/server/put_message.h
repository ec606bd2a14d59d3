// A Put message read where it lies: the slices of a PutRequest's `slice` or
// `batch`, each record left in gRPC's receive buffers as the pieces it
// arrived in, so that the store copies it once, into the block's pages.
// Anything else (a header, unknown or repeated fields) is left to protobuf,
// whose semantics it keeps.
#ifndef KVTIER_SERVICES_CACHE_SERVER_PUT_MESSAGE_H_
#define KVTIER_SERVICES_CACHE_SERVER_PUT_MESSAGE_H_

#include <grpcpp/support/slice.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/v1/cache.pb.h"

namespace kvtier::cache {

struct PutSliceView {
  std::string block_hash;
  // The record, in order, pointing into the message's slices (data), or
  // where it lies in the staging region (staged).
  std::vector<std::span<const uint8_t>> data;
  std::optional<v1::StagedRange> staged;
};

// The slices of `message` (a PutRequest in wire form, as gRPC's slices,
// which must outlive the views) when it is a `slice` or a `batch` of plain
// LayerSlices; nullopt for any other message, which the caller parses with
// protobuf (and answers INVALID_ARGUMENT if that fails too). A batch of
// more than `max_slices` is read no further than its first max_slices + 1.
std::optional<std::vector<PutSliceView>> ParsePutSlices(const std::vector<grpc::Slice>& message, size_t max_slices);

}  // namespace kvtier::cache

#endif  // KVTIER_SERVICES_CACHE_SERVER_PUT_MESSAGE_H_
