// What a DeepSeek-V4 sequence keeps per layer to continue: the sliding
// window's entries, the compressed entries (and on CSA layers their
// indexer keys), and each compressor's rows of the group still open. All
// values as the model rounds them (its FP8 and FP4 steps applied, entries'
// rotated dims in bf16), so a continuation from this state equals an
// uninterrupted run, and v4_cache_parts.h can store it without loss.
#ifndef KVTIER_SERVICES_RUNTIME_V4_STATE_H_
#define KVTIER_SERVICES_RUNTIME_V4_STATE_H_

#include <cstdint>
#include <vector>

namespace kvtier::runtime {

// A compressor's rows since its last emitted entry: kv and score
// ([rows][coff * dim], score with the position embedding added); with
// overlapping groups (ratio 4) also the first halves of the last closed
// group's rows ([ratio][dim]), which the next entry pools with the open
// group's second halves.
struct V4CompressorState {
  std::vector<float> kv, score;
  std::vector<float> previous_kv, previous_score;  // empty before the first group closes
};

struct V4LayerState {
  // Ring of the last sliding_window tokens' entries, [window][head_dim]:
  // the token at position p in slot p % window.
  std::vector<float> window;
  std::vector<float> compressed;  // [entries][head_dim], entry g pooling tokens g * ratio on
  std::vector<float> index_keys;  // CSA layers: [entries][index_head_dim]
  V4CompressorState compressor, index_compressor;
};

// What passes computed, for checking another implementation against them:
// [layer][position] each position's window entry, its indexer query (CSA
// layers; heads one after another, as rounded) and the compressed entries
// it attended (ascending).
struct V4Trace {
  std::vector<std::vector<std::vector<float>>> window, index_query;
  std::vector<std::vector<std::vector<uint32_t>>> chosen;
};

}  // namespace kvtier::runtime

#endif  // KVTIER_SERVICES_RUNTIME_V4_STATE_H_
