// Layouts the fuzz targets start from: small ones of every codec, one
// with DeepSeek-V3.2's indexer keys (format 2) and one of DeepSeek-V4
// (format 3).
#ifndef KVTIER_TESTS_FUZZ_LAYOUTS_H_
#define KVTIER_TESTS_FUZZ_LAYOUTS_H_

#include <vector>

#include "services/kvblock/layout.h"
#include "tests/v4_records.h"

namespace kvtier::fuzz {

inline std::vector<kvblock::LatentLayout> Layouts() {
  std::vector<kvblock::LatentLayout> layouts;
  for (kernels::Codec codec : kernels::kAllCodecs) {
    layouts.push_back({.model_id = "fuzz",
                       .num_layers = 3,
                       .kv_lora_rank = 32,
                       .rope_dim = 8,
                       .tokens_per_block = 4,
                       .codec = codec});
  }
  kvblock::LatentLayout indexed = layouts[2];
  indexed.indexer_dim = 16;
  indexed.indexer_encoding = kvblock::IndexerEncoding::kFp8;
  indexed.block_format_version = kvblock::kIndexedBlockFormatVersion;
  layouts.push_back(indexed);
  layouts.push_back(testing::SmallV4Layout());
  return layouts;
}

}  // namespace kvtier::fuzz

#endif  // KVTIER_TESTS_FUZZ_LAYOUTS_H_
