#include "services/kvblock/block_key.h"

#include <gtest/gtest.h>
#include <openssl/evp.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "services/kvblock/layout.h"
#include "tests/test_random.h"

namespace kvtier::kvblock {
namespace {

// The documented encoding, built byte by byte and hashed with OpenSSL's
// one-shot digest.
BlockHash ReferenceChainHash(const std::string& salt, const BlockHash& parent, uint64_t layout,
                             const std::vector<uint32_t>& tokens) {
  std::string m;
  auto put = [&m](const void* p, size_t n) { m.append(static_cast<const char*>(p), n); };
  const uint32_t salt_len = static_cast<uint32_t>(salt.size()), count = static_cast<uint32_t>(tokens.size());
  put(&salt_len, 4);
  m += salt;
  put(parent.data(), 32);
  put(&layout, 8);
  put(&count, 4);
  for (uint32_t t : tokens) put(&t, 4);
  BlockHash out;
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(m.data(), m.size(), out.data(), &len, EVP_sha256(), nullptr), 1);
  return out;
}

std::vector<uint32_t> RandomTokens(size_t n, std::mt19937_64& rng) {
  std::uniform_int_distribution<uint32_t> id(0, 102399);
  std::vector<uint32_t> t(n);
  for (auto& v : t) v = id(rng);
  return t;
}

TEST(BlockKey, MatchesTheDocumentedEncoding) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const auto tokens = RandomTokens(64, rng.engine());
  BlockHash parent;
  for (auto& b : parent) b = static_cast<uint8_t>(rng.engine()());
  EXPECT_EQ(ChainHash("tenant-a", parent, 0x1234567890abcdefull, tokens),
            ReferenceChainHash("tenant-a", parent, 0x1234567890abcdefull, tokens));
}

// docs/protocol.md's test vector; the Python client's tests check the same.
TEST(BlockKey, ChainIsTheDocumentedVector) {
  const LatentLayout tiny{.model_id = "m",
                          .num_layers = 1,
                          .kv_lora_rank = 4,
                          .rope_dim = 2,
                          .tokens_per_block = 2,
                          .codec = kernels::Codec::kBf16};
  const std::vector<uint32_t> tokens = {1, 2, 3, 4, 5};
  const std::vector<BlockHash> chain = ComputeBlockChain("default", LayoutId(tiny), 2, tokens);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(HashToHex(chain[1]), "6ed84cc4bce8f5454dd594e32bdfe6d93b5ea70ffb88d71fd39904b9713f018d");
  // The restore point after it (DeepSeek-V4), also documented.
  EXPECT_EQ(HashToHex(RestorePointKey(chain[1])), "99e9168de34035fa207dcd1e8faaec0e8138f932e38859c84c3e11f422ea9142");
}

TEST(BlockKey, EqualInputsGiveEqualKeysAndAnyChangeChangesThem) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const auto tokens = RandomTokens(64, rng.engine());
  const BlockHash parent = ChainHash("p", kNoParent, 1, tokens);
  const BlockHash base = ChainHash("ns", parent, 7, tokens);
  EXPECT_EQ(base, ChainHash("ns", parent, 7, tokens));

  std::set<BlockHash> seen = {base};
  auto expect_new = [&](const BlockHash& h, const char* what) {
    EXPECT_TRUE(seen.insert(h).second) << what << " did not change the key";
  };
  expect_new(ChainHash("ns2", parent, 7, tokens), "salt");
  expect_new(ChainHash("", parent, 7, tokens), "empty salt");
  expect_new(ChainHash("ns", kNoParent, 7, tokens), "parent");
  expect_new(ChainHash("ns", parent, 8, tokens), "layout id");
  for (size_t i : {size_t{0}, size_t{31}, size_t{63}}) {
    auto changed = tokens;
    changed[i] ^= 1;
    expect_new(ChainHash("ns", parent, 7, changed), "one token");
  }
  auto swapped = tokens;
  std::swap(swapped[0], swapped[1]);
  if (swapped != tokens) expect_new(ChainHash("ns", parent, 7, swapped), "token order");
  // Length prefixes: moving a byte between salt and tokens must not collide.
  expect_new(ChainHash("ns", parent, 7, std::span(tokens).first(63)), "token count");
}

TEST(BlockKey, ChainCoversFullBlocksAndLinksParents) {
  testing::SeededRng rng;
  SCOPED_TRACE(rng.Trace());
  const auto tokens = RandomTokens(64 * 3 + 5, rng.engine());
  const auto chain = ComputeBlockChain("ns", 99, 64, tokens);
  ASSERT_EQ(chain.size(), 3u);  // the 5-token tail has no key
  BlockHash parent = kNoParent;
  for (size_t i = 0; i < chain.size(); ++i) {
    const std::vector<uint32_t> block(tokens.begin() + i * 64, tokens.begin() + (i + 1) * 64);
    EXPECT_EQ(chain[i], ReferenceChainHash("ns", parent, 99, block));
    parent = chain[i];
  }
  // A shared prefix gives shared keys; a change in block 1 changes keys 1 and 2 only.
  auto other = tokens;
  other[64 + 10] += 1;
  const auto chain2 = ComputeBlockChain("ns", 99, 64, other);
  EXPECT_EQ(chain2[0], chain[0]);
  EXPECT_NE(chain2[1], chain[1]);
  EXPECT_NE(chain2[2], chain[2]);
  EXPECT_TRUE(ComputeBlockChain("ns", 99, 64, std::span(tokens).first(63)).empty());
}

TEST(BlockKey, BytesConversions) {
  const BlockHash h = ChainHash("ns", kNoParent, 1, std::vector<uint32_t>{1, 2, 3});
  EXPECT_EQ(HashToHex(h).size(), 64u);
  absl::StatusOr<BlockHash> back = HashFromBytes(std::string(HashAsBytes(h)));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, h);
  EXPECT_EQ(HashFromBytes("short").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvtier::kvblock
