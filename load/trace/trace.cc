#include "load/trace/trace.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kvtier::load {

absl::StatusOr<std::vector<TraceRequest>> ReadTrace(std::istream& in, size_t limit) {
  std::vector<TraceRequest> requests;
  std::string line;
  for (size_t number = 1; std::getline(in, line) && (limit == 0 || requests.size() < limit); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("trace line ", number, ": ", why));
    };
    if (!j.is_object()) return bad("not a JSON object");
    for (const char* field : {"timestamp", "input_length", "output_length"}) {
      if (!j.contains(field) || !j[field].is_number_integer() || j[field].get<int64_t>() < 0) {
        return bad(absl::StrCat("\"", field, "\" is not a non-negative integer"));
      }
    }
    if (!j.contains("hash_ids") || !j["hash_ids"].is_array()) return bad("\"hash_ids\" is not a list");
    TraceRequest r;
    r.timestamp_ms = j["timestamp"].get<int64_t>();
    r.input_length = j["input_length"].get<uint64_t>();
    r.output_length = j["output_length"].get<uint64_t>();
    for (const nlohmann::json& id : j["hash_ids"]) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0) return bad("a hash id is not a non-negative integer");
      r.hash_ids.push_back(id.get<uint64_t>());
    }
    requests.push_back(std::move(r));
  }
  return requests;
}

std::vector<kvblock::BlockHash> RequestBlocks(const TraceRequest& request, const BlockMapping& mapping) {
  const uint32_t per_trace_block = mapping.trace_block_tokens / mapping.tokens_per_block;
  const uint64_t whole = request.input_length / mapping.tokens_per_block;
  std::vector<kvblock::BlockHash> chain;
  kvblock::BlockHash parent = kvblock::kNoParent;
  for (size_t t = 0; t < request.hash_ids.size() && chain.size() < whole; ++t) {
    const uint64_t id = request.hash_ids[t];
    for (uint32_t part = 0; part < per_trace_block && chain.size() < whole; ++part) {
      // Stand-in tokens naming the trace block and the part of it.
      const std::vector<uint32_t> tokens = {static_cast<uint32_t>(id), static_cast<uint32_t>(id >> 32), part};
      parent = kvblock::ChainHash(mapping.ns, parent, mapping.layout_id, tokens);
      chain.push_back(parent);
    }
  }
  return chain;
}

std::vector<uint64_t> UnboundedHitTokens(const std::vector<TraceRequest>& requests, const BlockMapping& mapping) {
  std::set<kvblock::BlockHash> stored;
  std::vector<uint64_t> hits;
  for (const TraceRequest& r : requests) {
    const std::vector<kvblock::BlockHash> chain = RequestBlocks(r, mapping);
    size_t prefix = 0;
    while (prefix < chain.size() && stored.contains(chain[prefix])) ++prefix;
    hits.push_back(prefix * mapping.tokens_per_block);
    stored.insert(chain.begin(), chain.end());
  }
  return hits;
}

size_t RestoreBlocks(const TraceRequest& request, const BlockMapping& mapping, size_t chain_size) {
  if (request.input_length == 0) return 0;
  return std::min<size_t>(chain_size, (request.input_length - 1) / mapping.tokens_per_block);
}

std::vector<uint64_t> UnboundedRestorableTokens(const std::vector<TraceRequest>& requests,
                                                const BlockMapping& mapping) {
  std::set<kvblock::BlockHash> stored, points;  // points by the block before them
  std::vector<uint64_t> hits;
  for (const TraceRequest& r : requests) {
    const std::vector<kvblock::BlockHash> chain = RequestBlocks(r, mapping);
    const size_t restore = RestoreBlocks(r, mapping, chain.size());
    size_t prefix = 0;
    while (prefix < restore && stored.contains(chain[prefix])) ++prefix;
    while (prefix > 0 && !points.contains(chain[prefix - 1])) --prefix;
    hits.push_back(prefix * mapping.tokens_per_block);
    stored.insert(chain.begin(), chain.end());
    for (size_t m : kvblock::NewRestorePoints(0, restore, mapping.restore_every)) points.insert(chain[m - 1]);
  }
  return hits;
}

}  // namespace kvtier::load
