// The block record parser never trusts its input: every malformed record
// gets its own status and message, never a crash or an out-of-bounds read
// (run under ASan/UBSan with -DKVTIER_SANITIZE=ON).
#include "services/kvblock/block_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "services/kvblock/crc32c.h"
#include "tests/test_random.h"
#include "tests/v4_records.h"

namespace kvtier::kvblock {
namespace {

LatentLayout SmallLayout(kernels::Codec codec) {
  LatentLayout l;
  l.model_id = "test-model";
  l.num_layers = 3;
  l.kv_lora_rank = 24;
  l.rope_dim = 8;
  l.tokens_per_block = 5;
  l.codec = codec;
  return l;
}

// DeepSeek-V3.2's: the same with indexer keys of dim 16 (format 2).
LatentLayout IndexedLayout(kernels::Codec codec) {
  LatentLayout l = SmallLayout(codec);
  l.indexer_dim = 16;
  l.indexer_encoding = IndexerEncoding::kFp8;
  l.block_format_version = kIndexedBlockFormatVersion;
  return l;
}

std::vector<float> RandomLatents(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

// `count` layers' indexer parts of `l` as the model makes them: any code
// but NaN's, power-of-two scales.
std::vector<uint8_t> RandomIndexerParts(const LatentLayout& l, uint32_t count, std::mt19937_64& rng) {
  std::vector<uint8_t> parts(size_t{count} * l.IndexerPartBytes());
  if (parts.empty()) return parts;
  const size_t codes = size_t{l.tokens_per_block} * l.indexer_dim;
  for (uint32_t layer = 0; layer < count; ++layer) {
    uint8_t* part = parts.data() + layer * l.IndexerPartBytes();
    for (size_t i = 0; i < codes; ++i) part[i] = static_cast<uint8_t>(rng() % 0x7f) | (rng() % 2 ? 0x80 : 0);
    for (uint32_t t = 0; t < l.tokens_per_block; ++t) {
      const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 20) - 16);
      std::memcpy(part + codes + t * sizeof(float), &scale, sizeof scale);
    }
  }
  return parts;
}

std::string Encode(const LatentLayout& l, uint32_t begin, uint32_t count, std::mt19937_64& rng) {
  const auto x = RandomLatents(size_t{count} * l.LayerShape().values(), rng);
  absl::StatusOr<std::string> r = EncodeBlock(l, begin, count, x, RandomIndexerParts(l, count, rng));
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *r : std::string();
}

// Rewrites the trailing CRC so that only the intended defect remains.
void Reseal(std::string& record) {
  const uint32_t crc = Crc32c(record.data(), record.size() - 4);
  std::memcpy(record.data() + record.size() - 4, &crc, 4);
}

// Both formats: latents alone (1) and with indexer keys (2).
std::string FormatName(bool indexed) { return indexed ? "Format2" : "Format1"; }

class BlockFormatTest : public ::testing::TestWithParam<std::tuple<kernels::Codec, bool>> {
 protected:
  LatentLayout Layout() const {
    const auto [codec, indexed] = GetParam();
    return indexed ? IndexedLayout(codec) : SmallLayout(codec);
  }
  testing::SeededRng rng_;
};

TEST_P(BlockFormatTest, RoundTripsEveryCodec) {
  SCOPED_TRACE(rng_.Trace());
  const LatentLayout l = Layout();
  const auto x = RandomLatents(3 * l.LayerShape().values(), rng_.engine());
  const std::vector<uint8_t> keys = RandomIndexerParts(l, 3, rng_.engine());
  absl::StatusOr<std::string> record = EncodeBlock(l, 0, 3, x, keys);
  ASSERT_TRUE(record.ok()) << record.status();
  const size_t header = l.indexer_dim > 0 ? kIndexedBlockHeaderBytes : kBlockHeaderBytes;
  EXPECT_EQ(record->size(), header + 3 * l.LayerPayloadBytes() + kBlockTrailerBytes);

  absl::StatusOr<BlockView> view = ParseBlock(*record, &l);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->header.codec, l.codec);
  EXPECT_EQ(view->header.layout_id, LayoutId(l));
  EXPECT_EQ(view->header.layer_count, 3u);
  EXPECT_EQ(view->header.format_version, l.block_format_version);
  EXPECT_EQ(view->payloads.data(), record->data() + header);
  std::vector<float> y(x.size());
  ASSERT_TRUE(DecodeBlock(*view, y).ok());
  // Each layer: its latent part is the codec's bytes and decodes to what the
  // codec alone gives; its indexer part is the keys as given.
  const auto shape = l.LayerShape();
  for (uint32_t layer = 0; layer < 3; ++layer) {
    std::vector<uint8_t> enc(l.LatentPartBytes());
    std::vector<float> want(shape.values());
    ASSERT_TRUE(
        kernels::Quantize(l.codec, shape, std::span(x).subspan(layer * shape.values(), shape.values()), enc).ok());
    ASSERT_TRUE(kernels::Dequantize(l.codec, shape, enc, want).ok());
    EXPECT_TRUE(std::equal(want.begin(), want.end(), y.begin() + layer * shape.values()));
    EXPECT_EQ(view->LatentPart(layer), std::string_view(reinterpret_cast<const char*>(enc.data()), enc.size()));
    const std::string_view part = view->IndexerPart(layer);
    ASSERT_EQ(part.size(), l.IndexerPartBytes());
    EXPECT_EQ(part,
              std::string_view(reinterpret_cast<const char*>(keys.data()) + layer * l.IndexerPartBytes(), part.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, BlockFormatTest,
                         ::testing::Combine(::testing::ValuesIn(kernels::kAllCodecs), ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(kernels::CodecName(std::get<0>(info.param))) +
                                  FormatName(std::get<1>(info.param));
                         });

class BlockParserTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { record_ = Encode(layout_, 1, 2, rng_.engine()); }
  absl::Status Parse(const std::string& r) { return ParseBlock(r, &layout_).status(); }
  size_t HeaderBytes() const { return GetParam() ? kIndexedBlockHeaderBytes : kBlockHeaderBytes; }

  testing::SeededRng rng_;
  LatentLayout layout_ = GetParam() ? IndexedLayout(kernels::Codec::kInt8) : SmallLayout(kernels::Codec::kInt8);
  std::string record_;
};

INSTANTIATE_TEST_SUITE_P(BothFormats, BlockParserTest, ::testing::Bool(),
                         [](const auto& info) { return FormatName(info.param); });

TEST_P(BlockParserTest, HeaderFieldsAtTheDocumentedOffsets) {
  EXPECT_EQ(record_.substr(0, 4), "KVTB");
  uint16_t version, layer_begin, layer_count, latent, rope;
  uint64_t layout_id;
  uint32_t tokens, layer_bytes;
  std::memcpy(&version, &record_[4], 2);
  std::memcpy(&layout_id, &record_[8], 8);
  std::memcpy(&tokens, &record_[16], 4);
  std::memcpy(&layer_begin, &record_[20], 2);
  std::memcpy(&layer_count, &record_[22], 2);
  std::memcpy(&latent, &record_[24], 2);
  std::memcpy(&rope, &record_[26], 2);
  std::memcpy(&layer_bytes, &record_[28], 4);
  EXPECT_EQ(version, GetParam() ? 2 : 1);
  EXPECT_EQ(record_[6], static_cast<char>(kernels::Codec::kInt8));
  EXPECT_EQ(record_[7], 0);
  EXPECT_EQ(layout_id, LayoutId(layout_));
  EXPECT_EQ(tokens, 5u);
  EXPECT_EQ(layer_begin, 1);
  EXPECT_EQ(layer_count, 2);
  EXPECT_EQ(latent, 24);
  EXPECT_EQ(rope, 8);
  EXPECT_EQ(layer_bytes, layout_.LayerPayloadBytes());
  if (GetParam()) {
    uint16_t indexer_dim;
    uint32_t indexer_bytes;
    std::memcpy(&indexer_dim, &record_[32], 2);
    std::memcpy(&indexer_bytes, &record_[36], 4);
    EXPECT_EQ(indexer_dim, 16);
    EXPECT_EQ(record_[34], 1);  // FP8 codes and their scales
    EXPECT_EQ(record_[35], 0);
    EXPECT_EQ(indexer_bytes, 5u * (16 + 4));
    EXPECT_EQ(layer_bytes, kernels::EncodedBytes(kernels::Codec::kInt8, layout_.LayerShape()) + indexer_bytes);
  }
  uint32_t crc;
  std::memcpy(&crc, record_.data() + record_.size() - 4, 4);
  EXPECT_EQ(crc, Crc32c(record_.data(), record_.size() - 4));
}

TEST_P(BlockParserTest, EveryTruncationIsInvalidArgument) {
  for (size_t n = 0; n < record_.size(); ++n) {
    // A fresh heap copy of exactly n bytes, so ASan catches any over-read.
    std::string cut(record_.data(), n);
    absl::Status s = Parse(cut);
    ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << n << ": " << s;
    ASSERT_NE(s.message().find("truncated"), std::string::npos) << s;
  }
}

TEST_P(BlockParserTest, OversizedIsInvalidArgument) {
  absl::Status s = Parse(record_ + "x");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("oversized"), std::string::npos) << s;
}

TEST_P(BlockParserTest, BadMagicIsInvalidArgument) {
  std::string r = record_;
  r[0] = 'X';
  Reseal(r);
  absl::Status s = Parse(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("magic"), std::string::npos) << s;
}

TEST_P(BlockParserTest, WrongVersionIsFailedPrecondition) {
  std::string r = record_;
  r[4] = 4;
  Reseal(r);
  absl::Status s = Parse(r);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("version 4"), std::string::npos) << s;
}

TEST_P(BlockParserTest, WrongLayoutIsFailedPrecondition) {
  for (auto change : std::vector<std::function<void(LatentLayout&)>>{
           [](LatentLayout& l) { l.model_id = "other-model"; },
           [](LatentLayout& l) { l.num_layers = 2; },  // record holds layers 1..2
       }) {
    LatentLayout other = layout_;
    change(other);
    absl::Status s = ParseBlock(record_, &other).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
  // A record of another codec, or of the other format, checked against
  // this layout.
  for (const LatentLayout& other :
       {SmallLayout(kernels::Codec::kInt4), IndexedLayout(kernels::Codec::kInt4),
        GetParam() ? SmallLayout(kernels::Codec::kInt8) : IndexedLayout(kernels::Codec::kInt8)}) {
    const std::string record = Encode(other, 0, 1, rng_.engine());
    EXPECT_EQ(Parse(record).code(), absl::StatusCode::kFailedPrecondition);
    // With no expected layout, any well-formed record parses.
    EXPECT_TRUE(ParseBlock(record).ok());
  }
}

// Each field that disagrees with the others is named: a later check (the
// record's size) would refuse most of them too, but not say why.
TEST_P(BlockParserTest, InconsistentHeaderIsInvalidArgument) {
  struct Edit {
    size_t offset;
    uint8_t value;
    std::string message;
  };
  std::vector<Edit> edits = {
      {6, 9, "unknown codec 9"},
      {7, 1, "unknown flags 1"},
      {28, 1, "bytes per layer, but int8"},        // payload size no longer matches the codec
      {16, 0, "block token count 0 outside 1.."},  // low byte; the record has 5
      {22, 0, "empty or beyond 1024"},             // layer count 0
      {21, 4, "empty or beyond 1024"},             // layers from 1025 (layer_begin's high byte)
  };
  if (GetParam()) {
    edits.insert(edits.end(), {
                                  {32, 17, "indexer bytes per layer, but 5 keys of dim 17"},
                                  {32, 0, "indexer encoding 1 of dim 0"},
                                  {34, 0, "indexer encoding 0 of dim 16"},
                                  {34, 2, "indexer encoding 2 of dim 16"},
                                  {35, 1, "reserved byte 35 is 1"},
                                  {36, 1, "indexer bytes per layer, but 5 keys of dim 16"},
                              });
  }
  for (const Edit& e : edits) {
    std::string r = record_;
    r[e.offset] = static_cast<char>(e.value);
    Reseal(r);
    const absl::Status s = Parse(r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "offset " << e.offset << ": " << s;
    EXPECT_NE(s.message().find(e.message), std::string::npos) << "offset " << e.offset << ": " << s;
  }
}

// A record whose header names the expected layout's id but another shape,
// or layers the layout lacks (written by a peer that lies, or by a bug), is
// refused: the id alone is not trusted to vouch for the fields.
TEST_P(BlockParserTest, ARecordUnderTheLayoutsIdMustHaveItsShape) {
  SCOPED_TRACE(rng_.Trace());
  const auto claim = [](std::string record, const LatentLayout& as) {
    const uint64_t id = LayoutId(as);
    std::memcpy(record.data() + 8, &id, sizeof id);
    Reseal(record);
    return record;
  };
  LatentLayout other_codec = layout_;
  other_codec.codec = kernels::Codec::kInt4;
  absl::Status s = Parse(claim(Encode(other_codec, 0, 1, rng_.engine()), layout_));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("block is int4 5 tokens x (24 + 8), layout wants int8"), std::string::npos) << s;
  LatentLayout two_layers = layout_;
  two_layers.num_layers = 2;
  s = ParseBlock(claim(record_, two_layers), &two_layers).status();  // record_ holds layers 1 and 2
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("block holds layers [1, 3), layout has 2"), std::string::npos) << s;
}

TEST_P(BlockParserTest, AnyFlippedPayloadOrChecksumBitIsDataLoss) {
  SCOPED_TRACE(rng_.Trace());
  for (size_t at = HeaderBytes(); at < record_.size(); ++at) {
    std::string r = record_;
    r[at] ^= static_cast<char>(1u << (rng_.engine()() % 8));
    absl::Status s = Parse(r);
    ASSERT_EQ(s.code(), absl::StatusCode::kDataLoss) << "byte " << at << ": " << s;
  }
}

// kCheckedBefore skips only the CRC pass: a flipped payload bit goes unseen,
// a bad header, a truncation or another layout does not.
TEST_P(BlockParserTest, CheckedBeforeSkipsTheCrcAndNothingElse) {
  SCOPED_TRACE(rng_.Trace());
  const auto parse = [&](const std::string& r) { return ParseBlock(r, &layout_, CrcCheck::kCheckedBefore); };
  std::string flipped = record_;
  flipped[HeaderBytes() + rng_.engine()() % (record_.size() - HeaderBytes())] ^= 0x04;
  ASSERT_TRUE(parse(flipped).ok());
  EXPECT_EQ(parse(flipped)->payloads.data(), flipped.data() + HeaderBytes());
  EXPECT_EQ(parse(record_.substr(0, record_.size() - 1)).status().code(), absl::StatusCode::kInvalidArgument);
  std::string bad_magic = record_;
  bad_magic[0] = 'X';
  EXPECT_EQ(parse(bad_magic).status().code(), absl::StatusCode::kInvalidArgument);
  LatentLayout other = layout_;
  other.kv_lora_rank += 8;
  EXPECT_EQ(ParseBlock(record_, &other, CrcCheck::kCheckedBefore).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_P(BlockParserTest, RandomCorruptionNeverCrashesAndNeverParses) {
  SCOPED_TRACE(rng_.Trace());
  auto& rng = rng_.engine();
  for (int i = 0; i < 20000; ++i) {
    std::string r = record_;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) r[rng() % r.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) r.resize(rng() % (r.size() + 8), '\0');
    if (r == record_) continue;
    const std::string copy(r);  // exact-size heap buffer for ASan
    ASSERT_FALSE(ParseBlock(copy, &layout_).ok());
    (void)ParseBlock(copy).ok();
  }
  for (int i = 0; i < 2000; ++i) {
    std::string garbage(rng() % 200, '\0');
    for (char& c : garbage) c = static_cast<char>(rng());
    if (garbage.size() >= 4 && rng() % 2) {
      std::memcpy(garbage.data(), GetParam() ? "KVTB\2\0" : "KVTB\1\0", std::min<size_t>(6, garbage.size()));
    }
    ASSERT_FALSE(ParseBlock(garbage, &layout_).ok());
  }
}

TEST(BlockWriter, RejectsBadArguments) {
  const LatentLayout l = SmallLayout(kernels::Codec::kBf16);
  std::vector<float> x(l.LayerShape().values(), 1.0f);
  EXPECT_EQ(EncodeBlock(l, 3, 1, x).status().code(), absl::StatusCode::kInvalidArgument);  // beyond layers
  EXPECT_EQ(EncodeBlock(l, 0, 2, x).status().code(), absl::StatusCode::kInvalidArgument);  // too few values
  x[3] = NAN;
  absl::Status s = EncodeBlock(l, 1, 1, x).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("layer 1"), std::string::npos) << s;
  BlockHeader h = HeaderFor(l, 0, 1);
  EXPECT_EQ(SerializeBlock(h, "short").status().code(), absl::StatusCode::kInvalidArgument);
  // Format 1 has no place for indexer fields: a header with them is not written.
  h.indexer_dim = 16;
  s = SerializeBlock(h, std::string(h.PayloadBytes(), '\0')).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("format 1 has no indexer part"), std::string::npos) << s;
  // Indexer keys exactly when the layout has them, as many as its layers.
  x[3] = 1.0f;
  EXPECT_EQ(EncodeBlock(l, 0, 1, x, std::vector<uint8_t>(4)).status().code(), absl::StatusCode::kInvalidArgument);
  const LatentLayout indexed = IndexedLayout(kernels::Codec::kBf16);
  EXPECT_EQ(EncodeBlock(indexed, 0, 1, x).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EncodeBlock(indexed, 0, 1, x, std::vector<uint8_t>(indexed.IndexerPartBytes() + 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(EncodeBlock(indexed, 0, 1, x, std::vector<uint8_t>(indexed.IndexerPartBytes())).ok());
}

// A record cut into pieces anywhere reads back byte for byte, from any
// offset, and its trailer's CRC is found across a cut.
TEST(RecordPieces, CopyFromPiecesAndTrailerCrcReadAcrossAnyCuts) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 50; ++trial) {
    std::string record(std::uniform_int_distribution<size_t>(4, 3000)(rng.engine()), '\0');
    for (char& c : record) c = static_cast<char>(byte(rng.engine()));
    std::vector<std::span<const uint8_t>> pieces;
    for (size_t at = 0; at < record.size();) {
      const size_t n = std::min(record.size() - at, std::uniform_int_distribution<size_t>(1, 700)(rng.engine()));
      pieces.emplace_back(reinterpret_cast<const uint8_t*>(record.data()) + at, n);
      at += n;
    }
    const size_t offset = std::uniform_int_distribution<size_t>(0, record.size())(rng.engine());
    std::string out(std::uniform_int_distribution<size_t>(0, record.size() - offset)(rng.engine()), '\0');
    CopyFromPieces(pieces, offset, std::span(reinterpret_cast<uint8_t*>(out.data()), out.size()));
    EXPECT_EQ(out, record.substr(offset, out.size()));
    uint32_t trailer;
    std::memcpy(&trailer, record.data() + record.size() - 4, 4);
    EXPECT_EQ(TrailerCrc(pieces, record.size()), trailer);
  }
}

// DeepSeek-V4's records (format 3) at V4-Flash's schedule.
using testing::RandomV4Payload;
using testing::V4FlashLayout;

TEST(V4Record, BlocksAndRestorePointsRoundTripWithTheirKind) {
  testing::SeededRng seeded;
  SCOPED_TRACE(seeded.Trace());
  std::mt19937_64& rng = seeded.engine();
  const LatentLayout l = V4FlashLayout();
  ASSERT_TRUE(ValidateLayout(l).ok()) << ValidateLayout(l);
  const std::string block = RandomV4Payload(l, RecordKind::kBlock, 0, rng);
  EXPECT_EQ(block.size(), 449'824u);  // block_format.md's V4-Flash figures
  const std::string point = RandomV4Payload(l, RecordKind::kRestorePoint, 384, rng);
  EXPECT_EQ(point.size(), 3'644'424u);
  for (const auto& [kind, payload] :
       {std::pair(RecordKind::kBlock, block), std::pair(RecordKind::kRestorePoint, point)}) {
    absl::StatusOr<std::string> record = EncodeV4Record(l, kind, payload);
    ASSERT_TRUE(record.ok()) << record.status();
    EXPECT_EQ(record->size(), kBlockHeaderBytes + payload.size() + kBlockTrailerBytes);
    EXPECT_EQ(static_cast<uint8_t>((*record)[7]), static_cast<uint8_t>(kind));
    absl::StatusOr<BlockView> view = ParseBlock(*record, &l);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->header.format_version, kV4BlockFormatVersion);
    EXPECT_EQ(view->header.kind, kind);
    EXPECT_EQ(view->header.layer_count, 43u);
    EXPECT_EQ(view->payloads, payload);
    // Held in pieces (a tier's pages), the same checks.
    const auto* bytes = reinterpret_cast<const uint8_t*>(record->data());
    const std::span<const uint8_t> pieces[] = {{bytes, 20}, {bytes + 20, 7}, {bytes + 27, record->size() - 27}};
    absl::StatusOr<BlockHeader> scattered = ParseScatteredBlock(pieces, &l);
    ASSERT_TRUE(scattered.ok()) << scattered.status();
    EXPECT_EQ(scattered->kind, kind);
    // Any flipped payload bit is DATA_LOSS.
    std::string flipped = *record;
    flipped[kBlockHeaderBytes + rng() % payload.size()] ^= 1;
    EXPECT_EQ(ParseBlock(flipped, &l).status().code(), absl::StatusCode::kDataLoss);
  }
}

TEST(V4Record, SizesKindsAndLayoutsThatDoNotFitAreRefused) {
  testing::SeededRng seeded;
  SCOPED_TRACE(seeded.Trace());
  std::mt19937_64& rng = seeded.engine();
  const LatentLayout l = V4FlashLayout();
  const std::string block = RandomV4Payload(l, RecordKind::kBlock, 0, rng);
  const auto point = [&](uint64_t boundary) { return RandomV4Payload(l, RecordKind::kRestorePoint, boundary, rng); };
  struct Case {
    RecordKind kind;
    std::string payload;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {RecordKind::kBlock, block.substr(1), "the layout's blocks take 449824"},
           {RecordKind::kRestorePoint, point(100), "not a block boundary"},
           {RecordKind::kRestorePoint, point(0), "not a block boundary"},
           {RecordKind::kRestorePoint, point(256) + "x", "points there take"},
           {RecordKind::kRestorePoint, "1234567", "has no boundary"},
           {static_cast<RecordKind>(2), block, "record kind 2"},
       }) {
    absl::StatusOr<std::string> record = EncodeV4Record(l, c.kind, c.payload);
    ASSERT_EQ(record.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(record.status().message().find(c.message), std::string::npos) << record.status();
  }
  // The parser refuses the same with the CRC resealed over the defect.
  std::string record = *EncodeV4Record(l, RecordKind::kBlock, block);
  record[7] = 1;  // a block's bytes called a restore point
  Reseal(record);
  EXPECT_EQ(ParseBlock(record, &l).status().code(), absl::StatusCode::kInvalidArgument);
  record[7] = 5;
  Reseal(record);
  EXPECT_EQ(ParseBlock(record).status().code(), absl::StatusCode::kInvalidArgument);
  // Not a V4 layout's record, and not V3.2's.
  EXPECT_EQ(EncodeV4Record(IndexedLayout(kernels::Codec::kFp8), RecordKind::kBlock, block).status().code(),
            absl::StatusCode::kInvalidArgument);
  const LatentLayout v32 = IndexedLayout(kernels::Codec::kFp8);
  EXPECT_EQ(ParseBlock(*EncodeV4Record(l, RecordKind::kBlock, block), &v32).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // A format 1 record never carries a kind.
  std::string v1 = Encode(SmallLayout(kernels::Codec::kInt8), 0, 3, rng);
  v1[7] = 1;
  Reseal(v1);
  EXPECT_EQ(ParseBlock(v1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::kvblock
