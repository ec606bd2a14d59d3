#include "services/kvblock/layout.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>

#include "tests/v4_records.h"

namespace kvtier::kvblock {
namespace {

LatentLayout V2Lite() {
  return {.model_id = "deepseek-v2-lite",
          .num_layers = 27,
          .kv_lora_rank = 512,
          .rope_dim = 64,
          .tokens_per_block = 64,
          .codec = kernels::Codec::kInt8};
}

TEST(Layout, IdChangesWithEveryField) {
  const std::vector<std::function<void(LatentLayout&)>> changes = {
      [](LatentLayout& l) { l.model_id += "x"; },           [](LatentLayout& l) { l.num_layers += 1; },
      [](LatentLayout& l) { l.kv_lora_rank += 1; },         [](LatentLayout& l) { l.rope_dim += 1; },
      [](LatentLayout& l) { l.tokens_per_block += 1; },     [](LatentLayout& l) { l.codec = kernels::Codec::kInt4; },
      [](LatentLayout& l) { l.block_format_version += 1; },
  };
  std::set<uint64_t> ids = {LayoutId(V2Lite())};
  EXPECT_EQ(LayoutId(V2Lite()), LayoutId(V2Lite()));
  for (const auto& change : changes) {
    LatentLayout l = V2Lite();
    change(l);
    EXPECT_TRUE(ids.insert(LayoutId(l)).second) << "a field change left the id unchanged";
  }
}

// docs/protocol.md's test vector; the Python client's tests check the same.
TEST(Layout, IdIsTheDocumentedVector) {
  LatentLayout l = V2Lite();
  l.model_id = "deepseek-ai/DeepSeek-V2-Lite";
  EXPECT_EQ(LayoutId(l), 0xf7031e4b3c2f58feull);
}

TEST(Layout, ProtoRoundTripCarriesTheId) {
  const v1::LatentLayout p = LayoutToProto(V2Lite());
  EXPECT_EQ(p.layout_id(), LayoutId(V2Lite()));
  EXPECT_EQ(p.codec(), v1::KV_CODEC_INT8);
  absl::StatusOr<LatentLayout> back = LayoutFromProto(p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, V2Lite());
}

TEST(Layout, FromProtoRejectsBadFieldsByName) {
  struct Case {
    std::function<void(v1::LatentLayout&)> change;
    std::string field;
  };
  const std::vector<Case> cases = {
      {[](v1::LatentLayout& p) { p.clear_model_id(); }, "model_id"},
      {[](v1::LatentLayout& p) { p.set_num_layers(0); }, "num_layers"},
      {[](v1::LatentLayout& p) { p.set_codec(v1::KV_CODEC_UNSPECIFIED); }, "codec"},
      {[](v1::LatentLayout& p) { p.set_codec(static_cast<v1::KvCodec>(9)); }, "codec"},
      {[](v1::LatentLayout& p) { p.set_block_format_version(2); }, "block_format_version"},
      {[](v1::LatentLayout& p) { p.set_tokens_per_block(0); }, "tokens_per_block"},
      {[](v1::LatentLayout& p) { p.set_kv_lora_rank(0); }, "kv_lora_rank"},
      {[](v1::LatentLayout& p) { p.set_layout_id(p.layout_id() ^ 1); }, "layout_id"},
  };
  for (const Case& c : cases) {
    v1::LatentLayout p = LayoutToProto(V2Lite());
    c.change(p);
    absl::StatusOr<LatentLayout> l = LayoutFromProto(p);
    ASSERT_EQ(l.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_NE(l.status().message().find(c.field), std::string::npos) << l.status();
  }
}

LatentLayout V32() {
  LatentLayout l = V2Lite();
  l.model_id = "deepseek-v3.2";
  l.num_layers = 61;
  l.indexer_dim = 128;
  l.indexer_encoding = IndexerEncoding::kFp8;
  l.block_format_version = kIndexedBlockFormatVersion;
  return l;
}

// DeepSeek-V3.2's layouts: 132 bytes of indexer key a token a layer beside
// the latent, format 2, ids that change with the indexer fields (format 1
// layouts keep theirs: the documented vector above).
TEST(Layout, IndexerKeysMakeFormatTwo) {
  const LatentLayout l = V32();
  ASSERT_TRUE(ValidateLayout(l).ok()) << ValidateLayout(l);
  EXPECT_EQ(l.IndexerPartBytes(), 64u * 132);
  EXPECT_EQ(l.LayerPayloadBytes(), l.LatentPartBytes() + 64u * 132);
  EXPECT_EQ(V2Lite().IndexerPartBytes(), 0u);
  EXPECT_EQ(FormatVersionFor(IndexerEncoding::kFp8), 2u);
  EXPECT_EQ(FormatVersionFor(IndexerEncoding::kNone), 1u);
  std::set<uint64_t> ids = {LayoutId(l)};
  LatentLayout wider = l;
  wider.indexer_dim = 64;
  EXPECT_TRUE(ids.insert(LayoutId(wider)).second);
  LatentLayout keyless = l;
  keyless.indexer_dim = 0;
  keyless.indexer_encoding = IndexerEncoding::kNone;
  keyless.block_format_version = kBlockFormatVersion;
  EXPECT_TRUE(ids.insert(LayoutId(keyless)).second);

  absl::StatusOr<LatentLayout> back = LayoutFromProto(LayoutToProto(l));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, l);
  EXPECT_EQ(LayoutToProto(l).indexer_encoding(), v1::INDEXER_ENCODING_FP8);
}

// docs/protocol.md's format 2 vector; the Python client's tests check the same.
TEST(Layout, IndexedIdIsTheDocumentedVector) {
  LatentLayout l = V32();
  l.model_id = "deepseek-ai/DeepSeek-V3.2";
  l.codec = kernels::Codec::kFp8;
  EXPECT_EQ(LayoutId(l), 0xa0310fb54efa66ffull);
}

TEST(Layout, IndexerFieldsMustAgree) {
  const std::vector<std::pair<std::function<void(LatentLayout&)>, std::string>> cases = {
      {[](LatentLayout& l) { l.indexer_dim = 0; }, "indexer_dim"},
      {[](LatentLayout& l) { l.indexer_encoding = IndexerEncoding::kNone; }, "indexer_dim"},
      {[](LatentLayout& l) { l.indexer_dim = kMaxIndexerDim + 1; }, "indexer_dim"},
      {[](LatentLayout& l) { l.indexer_encoding = static_cast<IndexerEncoding>(7); }, "indexer_encoding"},
      {[](LatentLayout& l) { l.block_format_version = kBlockFormatVersion; }, "block_format_version"},
  };
  for (const auto& [change, field] : cases) {
    LatentLayout l = V32();
    change(l);
    const absl::Status s = ValidateLayout(l);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  }
  v1::LatentLayout p = LayoutToProto(V32());
  p.set_indexer_encoding(static_cast<v1::IndexerEncoding>(300));
  EXPECT_EQ(LayoutFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Layout, ProtoCodecNumbersMatchKernels) {
  EXPECT_EQ(static_cast<int>(kernels::Codec::kBf16), v1::KV_CODEC_BF16);
  EXPECT_EQ(static_cast<int>(kernels::Codec::kFp8), v1::KV_CODEC_FP8);
  EXPECT_EQ(static_cast<int>(kernels::Codec::kInt8), v1::KV_CODEC_INT8);
  EXPECT_EQ(static_cast<int>(kernels::Codec::kInt4), v1::KV_CODEC_INT4);
  EXPECT_EQ(static_cast<int>(IndexerEncoding::kNone), v1::INDEXER_ENCODING_NONE);
  EXPECT_EQ(static_cast<int>(IndexerEncoding::kFp8), v1::INDEXER_ENCODING_FP8);
}

LatentLayout V4Flash() { return testing::V4FlashLayout(); }

// docs/protocol.md's format 3 vector; the Python client's tests check the same.
TEST(Layout, V4IdIsTheDocumentedVector) {
  ASSERT_TRUE(ValidateLayout(V4Flash()).ok()) << ValidateLayout(V4Flash());
  EXPECT_EQ(LayoutId(V4Flash()), 0x92fc17c89146260dull);
}

TEST(Layout, V4IdChangesWithItsFieldsAndRoundTrips) {
  std::set<uint64_t> ids = {LayoutId(V4Flash())};
  for (const auto& change : std::vector<std::function<void(LatentLayout&)>>{
           [](LatentLayout& l) { std::swap(l.compress_ratios[2], l.compress_ratios[3]); },
           [](LatentLayout& l) { l.compress_ratios[0] = 128; },
           [](LatentLayout& l) { l.sliding_window = 64; },
           [](LatentLayout& l) { l.indexer_dim = 64; },
       }) {
    LatentLayout l = V4Flash();
    change(l);
    ASSERT_TRUE(ValidateLayout(l).ok()) << ValidateLayout(l);
    EXPECT_TRUE(ids.insert(LayoutId(l)).second) << "a field change left the id unchanged";
  }
  const v1::LatentLayout p = LayoutToProto(V4Flash());
  EXPECT_EQ(p.compress_ratios_size(), 43);
  EXPECT_EQ(p.indexer_encoding(), v1::INDEXER_ENCODING_MXFP4);
  absl::StatusOr<LatentLayout> back = LayoutFromProto(p);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, V4Flash());
}

TEST(Layout, V4FieldsMustFitTogether) {
  const std::vector<std::pair<std::function<void(LatentLayout&)>, std::string>> cases = {
      {[](LatentLayout& l) { l.compress_ratios.pop_back(); }, "42 entries for 43 layers"},
      {[](LatentLayout& l) { l.compress_ratios[3] = 256; }, "does not divide tokens_per_block"},
      {[](LatentLayout& l) { l.compress_ratios[3] = 3; }, "does not divide tokens_per_block"},
      {[](LatentLayout& l) { l.sliding_window = 0; }, "sliding_window"},
      {[](LatentLayout& l) { l.codec = kernels::Codec::kInt8; }, "codec fp8"},
      {[](LatentLayout& l) { l.rope_dim = 32; }, "whole blocks of 64"},
      {[](LatentLayout& l) { l.block_format_version = kIndexedBlockFormatVersion; }, "block_format_version"},
      {[](LatentLayout& l) { l.indexer_encoding = IndexerEncoding::kFp8; }, "MXFP4"},
      {[](LatentLayout& l) { l.indexer_dim = 48; }, "multiple of 32"},
      {[](LatentLayout& l) { std::replace(l.compress_ratios.begin(), l.compress_ratios.end(), 4u, 128u); },
       "one without them none"},
      // Every field within its own limit, but a block, or a restore point
      // of a full window, over the 32 bits a record's header has for it.
      {[](LatentLayout& l) {
         l.num_layers = kMaxLayers;
         l.kv_lora_rank = kernels::kMaxLatentDim;
         l.tokens_per_block = kernels::kMaxBlockTokens;
         l.compress_ratios.assign(kMaxLayers, 1);
         l.indexer_dim = 0;
         l.indexer_encoding = IndexerEncoding::kNone;
       },
       "does not fit a record"},
      {[](LatentLayout& l) {
         l.num_layers = kMaxLayers;
         l.kv_lora_rank = kernels::kMaxLatentDim;
         l.compress_ratios.assign(kMaxLayers, 0);
         l.indexer_dim = 0;
         l.indexer_encoding = IndexerEncoding::kNone;
         l.sliding_window = kernels::kMaxBlockTokens;
       },
       "does not fit a record"},
      // Not a V4 layout: no window, no MXFP4 keys.
      {[](LatentLayout& l) { l = V2Lite(), l.sliding_window = 128; }, "sliding_window"},
      {[](LatentLayout& l) {
         l = V32();
         l.indexer_encoding = IndexerEncoding::kMxfp4;
       },
       "MXFP4"},
  };
  for (const auto& [change, message] : cases) {
    LatentLayout l = V4Flash();
    change(l);
    const absl::Status s = ValidateLayout(l);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_NE(s.message().find(message), std::string::npos) << s;
  }
  v1::LatentLayout p = LayoutToProto(V4Flash());
  for (int i = 0; i < 1000; ++i) p.add_compress_ratios(4);
  EXPECT_EQ(LayoutFromProto(p).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::kvblock
