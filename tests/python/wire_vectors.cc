// Test vectors of the wire contract (docs/protocol.md), for another
// language's implementation to check, and a checker of that language's.
//
//   wire_vectors make SEED OUT.json   layouts with their ids, hash chains of
//                                     random token ids, and records of random
//                                     latents (outlier channels included) in
//                                     every codec, with random indexer keys
//                                     for format 2, as the C++ code makes them
//   wire_vectors check IN.json        recomputes every id, hash and record of
//                                     a file of the same shape with the C++
//                                     code; exits 1 naming the first that
//                                     differs, 0 when all agree
//
// Bytes travel as base64; latents as float32 little-endian; indexer keys
// ("indexer_parts", format 2 only) as every layer's part, in order.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "services/kvblock/block_format.h"
#include "services/kvblock/block_key.h"
#include "services/kvblock/layout.h"
#include "tests/v4_records.h"

namespace kvtier::kvblock {
namespace {

using nlohmann::json;

json LayoutJson(const LatentLayout& l) {
  return {{"model_id", l.model_id},
          {"num_layers", l.num_layers},
          {"kv_lora_rank", l.kv_lora_rank},
          {"rope_dim", l.rope_dim},
          {"tokens_per_block", l.tokens_per_block},
          {"codec", static_cast<int>(l.codec)},
          {"block_format_version", l.block_format_version},
          {"indexer_dim", l.indexer_dim},
          {"indexer_encoding", static_cast<int>(l.indexer_encoding)},
          {"compress_ratios", l.compress_ratios},
          {"sliding_window", l.sliding_window}};
}

LatentLayout LayoutFrom(const json& j) {
  LatentLayout l;
  l.model_id = j.at("model_id").get<std::string>();
  l.num_layers = j.at("num_layers");
  l.kv_lora_rank = j.at("kv_lora_rank");
  l.rope_dim = j.at("rope_dim");
  l.tokens_per_block = j.at("tokens_per_block");
  l.codec = static_cast<kernels::Codec>(j.at("codec").get<int>());
  l.block_format_version = j.at("block_format_version");
  l.indexer_dim = j.value("indexer_dim", 0u);
  l.indexer_encoding = static_cast<IndexerEncoding>(j.value("indexer_encoding", 0));
  l.compress_ratios = j.value("compress_ratios", std::vector<uint32_t>{});
  l.sliding_window = j.value("sliding_window", 0u);
  return l;
}

std::string Base64(std::string_view bytes) { return absl::Base64Escape(absl::string_view(bytes.data(), bytes.size())); }

std::string Unbase64(const json& j) {
  std::string out;
  if (!absl::Base64Unescape(j.get<std::string>(), &out)) throw std::runtime_error("bad base64");
  return out;
}

// Gaussian latents with a few outlier channels (x40) and one spike token,
// as real MLA latents have.
std::vector<float> Latents(std::mt19937_64& rng, size_t tokens, size_t dim, size_t layers) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<size_t> channel(0, dim - 1), token(0, tokens - 1);
  std::vector<float> x(layers * tokens * dim);
  for (float& v : x) v = normal(rng);
  for (size_t l = 0; l < layers; ++l) {
    float* layer = x.data() + l * tokens * dim;
    for (int k = 0; k < 3; ++k) {
      const size_t c = channel(rng);
      for (size_t t = 0; t < tokens; ++t) layer[t * dim + c] *= 40.0f;
    }
    const size_t t = token(rng);
    for (size_t c = 0; c < dim; ++c) layer[t * dim + c] *= 8.0f;
  }
  return x;
}

// Indexer parts of `layers` layers as the model makes them: any code but
// NaN's, power-of-two scales.
std::string IndexerParts(std::mt19937_64& rng, const LatentLayout& l, size_t layers) {
  std::string parts;
  const size_t codes = size_t{l.tokens_per_block} * l.indexer_dim;
  for (size_t layer = 0; layer < layers && l.indexer_dim > 0; ++layer) {
    for (size_t i = 0; i < codes; ++i) parts += static_cast<char>((rng() % 0x7f) | (rng() % 2 ? 0x80 : 0));
    for (uint32_t t = 0; t < l.tokens_per_block; ++t) {
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 24) - 20);
      parts.append(reinterpret_cast<const char*>(&scale), sizeof scale);
    }
  }
  return parts;
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return std::span(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

// A small DeepSeek-V4 layout's block and a restore point (format 3), of
// random payload bytes (the record does not read them, but a restore
// point's boundary).
json V4Cases(std::mt19937_64& rng) {
  const LatentLayout l{.model_id = "deepseek-ai/DeepSeek-V4@vectors",
                       .num_layers = 4,
                       .kv_lora_rank = 128,
                       .rope_dim = 64,
                       .tokens_per_block = 16,
                       .codec = kernels::Codec::kFp8,
                       .block_format_version = kV4BlockFormatVersion,
                       .indexer_dim = 32,
                       .indexer_encoding = IndexerEncoding::kMxfp4,
                       .compress_ratios = {0, 4, 16, 4},
                       .sliding_window = 16};
  json cases = json::array();
  for (const RecordKind kind : {RecordKind::kBlock, RecordKind::kRestorePoint}) {
    const std::string payload = testing::RandomV4Payload(l, kind, 16 * (1 + rng() % 4), rng);
    absl::StatusOr<std::string> record = EncodeV4Record(l, kind, payload);
    if (!record.ok()) throw std::runtime_error(std::string(record.status().message()));
    cases.push_back({{"layout", LayoutJson(l)},
                     {"layout_id", absl::StrCat(absl::Hex(LayoutId(l), absl::kZeroPad16))},
                     {"kind", static_cast<int>(kind)},
                     {"payload", Base64(payload)},
                     {"record", Base64(*record)}});
  }
  return cases;
}

// Empty when case `c`'s layout is valid and its id the one C++ computes,
// else what differs.
std::string CheckLayout(const json& c, const LatentLayout& l) {
  if (absl::Status s = ValidateLayout(l); !s.ok()) return std::string(s.message());
  const std::string id = absl::StrCat(absl::Hex(LayoutId(l), absl::kZeroPad16));
  if (c.at("layout_id") != id) return absl::StrCat("layout id ", c.at("layout_id").dump(), ", C++ computes ", id);
  return "";
}

// Empty when V4 case `c` agrees with the C++ code, else what differs.
std::string CheckV4(const json& c) {
  const LatentLayout l = LayoutFrom(c.at("layout"));
  if (std::string why = CheckLayout(c, l); !why.empty()) return why;
  absl::StatusOr<std::string> record =
      EncodeV4Record(l, static_cast<RecordKind>(c.at("kind").get<int>()), Unbase64(c.at("payload")));
  if (!record.ok()) return absl::StrCat("C++ cannot encode the payload: ", record.status().message());
  if (*record != Unbase64(c.at("record"))) return "the V4 record differs";
  if (absl::StatusOr<BlockView> parsed = ParseBlock(*record, &l); !parsed.ok()) {
    return absl::StrCat("V4 record does not parse: ", parsed.status().message());
  }
  return "";
}

json Make(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<LatentLayout> shapes = {
      {.model_id = "deepseek-ai/DeepSeek-V2-Lite@vectors",
       .num_layers = 2,
       .kv_lora_rank = 512,
       .rope_dim = 64,
       .tokens_per_block = 16},
      {.model_id = "odd", .num_layers = 3, .kv_lora_rank = 129, .rope_dim = 7, .tokens_per_block = 5},
      {.model_id = "no-rope", .num_layers = 1, .kv_lora_rank = 200, .rope_dim = 0, .tokens_per_block = 3},
      {.model_id = "deepseek-ai/DeepSeek-V3.2@vectors",
       .num_layers = 2,
       .kv_lora_rank = 512,
       .rope_dim = 64,
       .tokens_per_block = 8,
       .block_format_version = kIndexedBlockFormatVersion,
       .indexer_dim = 128,
       .indexer_encoding = IndexerEncoding::kFp8},
  };
  json out = {{"seed", seed}, {"cases", json::array()}};
  std::uniform_int_distribution<uint32_t> token_id(0, 102399);
  for (const LatentLayout& shape : shapes) {
    for (kernels::Codec codec : kernels::kAllCodecs) {
      LatentLayout l = shape;
      l.codec = codec;
      json c = {{"layout", LayoutJson(l)}, {"layout_id", absl::StrCat(absl::Hex(LayoutId(l), absl::kZeroPad16))}};
      std::vector<uint32_t> tokens(3 * l.tokens_per_block + 1);
      for (uint32_t& t : tokens) t = token_id(rng);
      const std::string ns = absl::StrCat("tenant-", seed % 1000);
      json hashes = json::array();
      for (const BlockHash& h : ComputeBlockChain(ns, LayoutId(l), l.tokens_per_block, tokens)) {
        hashes.push_back(HashToHex(h));
      }
      c["namespace"] = ns;
      c["token_ids"] = tokens;
      c["block_hashes"] = hashes;
      const std::vector<float> x = Latents(rng, l.tokens_per_block, l.LayerShape().dim(), l.num_layers);
      c["latents"] = Base64(std::string_view(reinterpret_cast<const char*>(x.data()), x.size() * sizeof(float)));
      const std::string keys = IndexerParts(rng, l, l.num_layers);
      if (!keys.empty()) c["indexer_parts"] = Base64(keys);
      absl::StatusOr<std::string> record = EncodeBlock(l, 0, l.num_layers, x, Bytes(keys));
      if (!record.ok()) throw std::runtime_error(std::string(record.status().message()));
      c["record"] = Base64(*record);
      out["cases"].push_back(c);
    }
  }
  out["v4_cases"] = V4Cases(rng);
  return out;
}

// Empty when case `c` agrees with the C++ code, else what differs.
std::string Check(const json& c) {
  const LatentLayout l = LayoutFrom(c.at("layout"));
  if (std::string why = CheckLayout(c, l); !why.empty()) return why;
  const std::vector<uint32_t> tokens = c.at("token_ids").get<std::vector<uint32_t>>();
  const std::vector<BlockHash> chain =
      ComputeBlockChain(c.at("namespace").get<std::string>(), LayoutId(l), l.tokens_per_block, tokens);
  if (chain.size() != c.at("block_hashes").size()) return "a different number of block hashes";
  for (size_t i = 0; i < chain.size(); ++i) {
    if (c.at("block_hashes")[i] != HashToHex(chain[i])) return absl::StrCat("block hash ", i, " differs");
  }
  const std::string raw = Unbase64(c.at("latents"));
  std::vector<float> x(raw.size() / sizeof(float));
  std::memcpy(x.data(), raw.data(), x.size() * sizeof(float));
  const std::string keys = c.contains("indexer_parts") ? Unbase64(c.at("indexer_parts")) : "";
  absl::StatusOr<std::string> record = EncodeBlock(l, 0, l.num_layers, x, Bytes(keys));
  if (!record.ok()) return absl::StrCat("C++ cannot encode the latents: ", record.status().message());
  const std::string theirs = Unbase64(c.at("record"));
  if (*record != theirs) {
    size_t at = 0;
    while (at < std::min(record->size(), theirs.size()) && (*record)[at] == theirs[at]) ++at;
    return absl::StrCat("record differs from byte ", at, " of ", record->size());
  }
  if (absl::StatusOr<BlockView> parsed = ParseBlock(theirs, &l); !parsed.ok()) {
    return absl::StrCat("record does not parse: ", parsed.status().message());
  }
  return "";
}

int Main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "make" && argc == 4) {
    std::ofstream(argv[3]) << Make(std::stoull(argv[2])).dump(1) << "\n";
    return 0;
  }
  if (mode == "check" && argc == 3) {
    const json in = json::parse(std::ifstream(argv[2]));
    size_t n = 0;
    for (const json& c : in.at("cases")) {
      if (const std::string why = Check(c); !why.empty()) {
        std::cerr << "case " << n << " (" << c.at("layout").dump() << "): " << why << "\n";
        return 1;
      }
      ++n;
    }
    for (const json& c : in.value("v4_cases", json::array())) {
      if (const std::string why = CheckV4(c); !why.empty()) {
        std::cerr << "case " << n << " (" << c.at("layout").dump() << "): " << why << "\n";
        return 1;
      }
      ++n;
    }
    std::cout << n << " cases agree\n";
    return n > 0 ? 0 : 1;
  }
  std::cerr << "usage: wire_vectors make SEED OUT.json | wire_vectors check IN.json\n";
  return 2;
}

}  // namespace
}  // namespace kvtier::kvblock

int main(int argc, char** argv) { return kvtier::kvblock::Main(argc, argv); }
