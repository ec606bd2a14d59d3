// DeepSeek-V4 as DeepSeek's V4-Flash inference/model.py computes a prompt
// in one pass (its start_pos == 0 path: every group compressed at once,
// masks for causality), plainly, in double: tensors read by their
// published names, the FP8/FP4 roundings, Hadamard, RoPE, Sinkhorn and
// top-k written here apart from the engine's (which runs position by
// position). Test-only and slow.
#ifndef KVTIER_TESTS_REFERENCE_NAIVE_V4_H_
#define KVTIER_TESTS_REFERENCE_NAIVE_V4_H_

#include <cstdint>
#include <vector>

#include "services/runtime/checkpoint.h"
#include "services/runtime/v4_state.h"

namespace kvtier::testing {

struct NaiveV4Result {
  // Logits after each token: row p from the context tokens 0..p.
  std::vector<std::vector<double>> logits;
  // CSA layers: [layer][p] the compressed entries position p attended,
  // ascending (empty vectors for other layers), and whether that choice
  // was tied (the k-th and the next score within 1e-9 relative).
  std::vector<std::vector<std::vector<uint32_t>>> chosen;
  std::vector<std::vector<bool>> tied;
  // [layer] every closed group's compressed entry, and on CSA layers its
  // indexer key, one after another; [layer][p] position p's window entry.
  std::vector<std::vector<double>> compressed, index_keys;
  std::vector<std::vector<std::vector<double>>> window;
  // Rounded values taken from the engine (NaiveV4Options::engine_*).
  size_t adopted = 0;
  // Inputs of FP8/FP4 products so near a rounding boundary that float and
  // double arithmetic may round them apart (see AmbiguousFp8): where any
  // is, a run may diverge from the engine's without either being wrong.
  size_t ambiguous_inputs = 0;
};

// Mutations the tests use to show they would catch a wrong model; each
// leaves out or changes one thing the model does.
struct NaiveV4Options {
  bool fp8_rounding = true;     // the entries' FP8 rounding
  bool sinks = true;            // the attention sinks
  bool inverse_rope = true;     // un-rotating the outputs
  bool indexer = true;          // false: CSA layers attend every visible entry
  bool yarn_on_window = false;  // true: window-only layers rotate with YaRN too
  // The engine's rounded entries and keys (its trace of the same tokens
  // and its caches' state after them): where this model's value before
  // rounding lies within 1e-5 (of the vector's largest value) of the
  // midpoint between its code
  // and the engine's, float and double arithmetic may round either way,
  // and the engine's code is taken, so that one such value does not make
  // the two runs diverge. Any other difference is kept.
  const runtime::V4Trace* engine_trace = nullptr;
  const std::vector<runtime::V4LayerState>* engine_state = nullptr;
};

NaiveV4Result NaiveV4Forward(const runtime::Checkpoint& ckpt, const std::vector<uint32_t>& tokens,
                             const NaiveV4Options& options = {});

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_REFERENCE_NAIVE_V4_H_
