#include "services/runtime/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kvtier/kernels/float_formats.h"
#include "tests/test_random.h"

namespace kvtier::runtime {
namespace {

class SafetensorsTest : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Path(const std::string& name) {
    std::filesystem::create_directories(dir_);
    return (dir_ / name).string();
  }
  std::vector<float> Random(size_t n) {
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng_.engine());
    return v;
  }
  // Writes raw bytes: an 8-byte length, `header`, then `data`.
  std::string WriteRaw(const std::string& name, const std::string& header, size_t data_bytes,
                       std::optional<uint64_t> length = std::nullopt) {
    const std::string path = Path(name);
    std::ofstream out(path, std::ios::binary);
    const uint64_t n = length.value_or(header.size());
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << header << std::string(data_bytes, '\0');
    return path;
  }

  testing::SeededRng rng_;
  std::filesystem::path dir_ = std::filesystem::temp_directory_path() / ("kvtier_st_" + std::to_string(rng_.seed()));
};

// F8_E4M3, as DeepSeek-V3 publishes its projections: one byte a value,
// rounded to nearest even, read back as the codes' values.
TEST_F(SafetensorsTest, Fp8E4m3RoundTrips) {
  SCOPED_TRACE(rng_.Trace());
  std::vector<float> values = Random(9 * 5);
  for (float& v : values) v *= 10.0f;  // N(0, 30): inside +-448
  const std::string path = Path("fp8.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"w.weight", DType::kF8E4m3, {9, 5}, values}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto t = (*file)->Tensor("w.weight");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->dtype, DType::kF8E4m3);
  EXPECT_STREQ(DTypeName(t->dtype), "F8_E4M3");
  EXPECT_EQ(t->bytes.size(), values.size());
  const std::vector<float> back = t->ToFloat();
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(back[i], kernels::Fp8E4m3ToFloat(kernels::FloatToFp8E4m3(values[i])));
    EXPECT_NEAR(back[i], values[i], std::fabs(values[i]) * 0x1p-4 + 0x1p-10) << "within half an fp8 step";
  }
}

TEST_F(SafetensorsTest, RoundTripsEveryDtype) {
  SCOPED_TRACE(rng_.Trace());
  const std::vector<float> a = Random(6 * 7), b = Random(5), c = Random(3 * 2 * 4);
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(
      WriteSafetensors(
          path, {{"a.weight", DType::kBf16, {6, 7}, a}, {"b", DType::kF16, {5}, b}, {"c", DType::kF32, {3, 2, 4}, c}})
          .ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ((*file)->tensors().size(), 3u);
  auto ta = (*file)->Tensor("a.weight");
  ASSERT_TRUE(ta.ok());
  EXPECT_EQ(ta->dtype, DType::kBf16);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{6, 7}));
  const std::vector<float> ra = ta->ToFloat(), rb = (*file)->Tensor("b")->ToFloat(),
                           rc = (*file)->Tensor("c")->ToFloat();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(ra[i], kernels::Bf16ToFloat(kernels::FloatToBf16(a[i])));
  for (size_t i = 0; i < b.size(); ++i) EXPECT_NEAR(rb[i], b[i], std::fabs(b[i]) * 0x1p-11);
  EXPECT_EQ(rc, c);
  EXPECT_EQ((*file)->Tensor("missing").status().code(), absl::StatusCode::kNotFound);
  // Data is 8-byte aligned after the header, as the format recommends.
  uint64_t header_len;
  std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(&header_len), 8);
  EXPECT_EQ(header_len % 8, 0u);
}

// I32 and I64, as DeepSeek-V4's releases store a hash router's table
// (one or the other): whole numbers, read back exactly, negatives too;
// I8 (its packed FP4 experts) and F8_E8M0 (their scales: 2^(byte - 127)).
TEST_F(SafetensorsTest, IntegersRoundTrip) {
  SCOPED_TRACE(rng_.Trace());
  std::uniform_int_distribution<int> id(-300, 300);
  std::vector<float> values(12);
  for (float& v : values) v = static_cast<float>(id(rng_.engine()));
  const std::string path = Path("ints.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"i32", DType::kI32, {3, 4}, values}, {"i64", DType::kI64, {12}, values}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const char* name : {"i32", "i64"}) {
    auto t = (*file)->Tensor(name);
    ASSERT_TRUE(t.ok());
    EXPECT_STREQ(DTypeName(t->dtype), name[1] == '3' ? "I32" : "I64");
    EXPECT_EQ(t->bytes.size(), values.size() * (name[1] == '3' ? 4 : 8));
    EXPECT_EQ(t->ToFloat(), values) << name;
  }
  int64_t first;
  std::memcpy(&first, (*file)->Tensor("i64")->bytes.data(), 8);
  EXPECT_EQ(first, static_cast<int64_t>(values[0]));

  const std::vector<float> bytes = {-128, -1, 0, 127}, scales = {0x1p-127f, 0x1p-3f, 1.0f, 0x1p127f};
  ASSERT_TRUE(WriteSafetensors(path, {{"i8", DType::kI8, {4}, bytes}, {"e8m0", DType::kF8E8m0, {4}, scales}}).ok());
  auto small = SafetensorsFile::Open(path);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ((*small)->Tensor("i8")->ToFloat(), bytes);
  EXPECT_EQ((*small)->Tensor("i8")->bytes[0], 0x80);
  EXPECT_EQ((*small)->Tensor("e8m0")->ToFloat(), scales);
  EXPECT_EQ((*small)->Tensor("e8m0")->bytes[2], 127);
  EXPECT_STREQ(DTypeName((*small)->Tensor("e8m0")->dtype), "F8_E8M0");
}

TEST(Half, EveryFiniteCodeRoundTripsAndRoundingIsNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
  // Midpoints go to the even neighbour; past the largest value is inf.
  for (uint16_t h : {0x0001, 0x0400, 0x3c00, 0x3c01, 0x7bfe}) {
    const double mid = (double{HalfToFloat(h)} + HalfToFloat(h + 1)) / 2;
    EXPECT_EQ(FloatToHalf(static_cast<float>(mid)), (h & 1) ? h + 1 : h) << std::hex << h;
  }
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
}

TEST_F(SafetensorsTest, MalformedFilesGetClearErrors) {
  struct Case {
    std::string path;
    std::string message;
  };
  const std::string tensor = R"("w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  const std::vector<Case> cases = {
      {WriteRaw("short", "", 0, 0).substr(0), "header is not a JSON object"},
      {WriteRaw("len", "{}", 0, 1 << 20), "runs past the end"},
      {WriteRaw("json", "{not json", 0), "header is not a JSON object"},
      {WriteRaw("dtype", R"({"w":{"dtype":"U16","shape":[2],"data_offsets":[0,4]}})", 4),
       "tensor w: dtype U16 is not supported"},
      {WriteRaw("trunc", "{" + tensor + "}", 8), "tensor w: data_offsets [0, 16) outside the 8 data bytes"},
      {WriteRaw("size", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "tensor w: 8 bytes, but shape and F32 need 12"},
      {WriteRaw("shape", R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
       "tensor w: shape has a negative"},
      {WriteRaw("fields", R"({"w":{"dtype":"F32"}})", 0), "tensor w: needs dtype, shape"},
      // 2^24 x 2^40 elements: each dimension allowed, the product wraps to 0
      // in 64 bits and would match no bytes.
      {WriteRaw("wrap", R"({"w":{"dtype":"F32","shape":[16777216,1099511627776],"data_offsets":[0,0]}})", 0),
       "tensor w: shape is too large"},
  };
  for (const Case& c : cases) {
    auto file = SafetensorsFile::Open(c.path);
    ASSERT_FALSE(file.ok()) << c.path;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
    EXPECT_NE(file.status().message().find(c.message), std::string::npos) << file.status();
  }
  std::ofstream(Path("tiny")) << "abc";
  EXPECT_NE(SafetensorsFile::Open(Path("tiny")).status().message().find("too short"), std::string::npos);
  EXPECT_EQ(SafetensorsFile::Open(Path("absent")).status().code(), absl::StatusCode::kNotFound);
  // A good file cut short loses its last tensor's bytes: refused, not misread.
  const std::string good = Path("good");
  ASSERT_TRUE(WriteSafetensors(good, {{"x", DType::kF32, {64}, Random(64)}}).ok());
  std::filesystem::resize_file(good, std::filesystem::file_size(good) - 1);
  EXPECT_NE(SafetensorsFile::Open(good).status().message().find("tensor x"), std::string::npos);
}

// Headers changed at random (a shape dimension, an offset or a dtype set to
// an edge value or to another JSON type, a key dropped, a tensor's entry
// copied under another name) or the length field changed: Open refuses the
// file with INVALID_ARGUMENT or returns tensors whose bytes lie inside the
// file and match their shape and dtype. Never a crash (run it under ASan
// too).
TEST_F(SafetensorsTest, MangledHeadersAreRefusedOrConsistent) {
  SCOPED_TRACE(rng_.Trace());
  std::mt19937_64& rng = rng_.engine();
  const std::string good = Path("good");
  ASSERT_TRUE(WriteSafetensors(good, {{"a", DType::kF32, {4, 3}, Random(12)},
                                      {"b", DType::kBf16, {5}, Random(5)},
                                      {"c", DType::kF16, {2, 2, 2}, Random(8)}})
                  .ok());
  std::ifstream in(good, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(bytes.substr(8, header_len));
  const std::string data = bytes.substr(8 + header_len);
  const nlohmann::json edges[] = {0,
                                  1,
                                  -1,
                                  3,
                                  4,
                                  16,
                                  16777216,
                                  1099511627776ull,
                                  18446744073709551615ull,
                                  2.5,
                                  "7",
                                  nullptr,
                                  nlohmann::json::array(),
                                  nlohmann::json::object()};
  for (int round = 0; round < 400; ++round) {
    nlohmann::json h = header;
    const std::string names[] = {"a", "b", "c"};
    for (int edit = 1 + static_cast<int>(rng() % 3); edit > 0; --edit) {
      nlohmann::json& t = h[names[rng() % 3]];
      switch (rng() % 6) {
        case 0:
          if (t.contains("shape") && !t["shape"].empty()) {
            t["shape"][rng() % t["shape"].size()] = edges[rng() % std::size(edges)];
          }
          break;
        case 1:
          t["data_offsets"][rng() % 2] = edges[rng() % std::size(edges)];
          break;
        case 2: {
          const char* dtypes[] = {"F32", "BF16", "F16", "I8", "F64", ""};
          t["dtype"] = dtypes[rng() % std::size(dtypes)];
          break;
        }
        case 3: {
          const char* keys[] = {"shape", "dtype", "data_offsets"};
          t.erase(keys[rng() % 3]);
          break;
        }
        case 4:
          t["shape"].push_back(edges[rng() % std::size(edges)]);
          break;
        default: {
          nlohmann::json& copy = h["copy" + std::to_string(rng() % 3)];
          copy = t;
          if (copy.contains("data_offsets") && copy["data_offsets"].is_array() && !copy["data_offsets"].empty()) {
            copy["data_offsets"][0] = edges[rng() % std::size(edges)];
          }
          break;
        }
      }
    }
    std::string text = h.dump();
    uint64_t length = text.size();
    if (rng() % 8 == 0) length = (rng() % 2) ? length + 1 + rng() % 64 : rng() % (length + 1);
    const std::string path = WriteRaw("mangled", text + data, 0, length);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status() << "\n" << text;
      continue;
    }
    const size_t file_size = std::filesystem::file_size(path);
    for (const auto& [name, view] : (*file)->tensors()) {
      __int128 elements = 1;
      for (int64_t d : view.shape) elements *= d;
      EXPECT_EQ(static_cast<__int128>(view.bytes.size()), elements * static_cast<__int128>(DTypeBytes(view.dtype)))
          << name << " in\n"
          << text;
      EXPECT_LE(view.bytes.size(), file_size) << name;
      EXPECT_EQ(view.ToFloat().size(), static_cast<size_t>(view.elements())) << name;
    }
  }
}

}  // namespace
}  // namespace kvtier::runtime
