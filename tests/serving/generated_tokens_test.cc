// When a generation ends, and the message of a generated token.
#include "services/serving/generated_tokens.h"

#include <gtest/gtest.h>

namespace kvtier::serving {
namespace {

TEST(FinishAfter, StopIdsFirstThenLength) {
  v1::GenerationLimits limits;
  limits.set_max_new_tokens(3);
  limits.add_stop_token_ids(7);
  EXPECT_EQ(FinishAfter(0, 5, limits), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_EQ(FinishAfter(1, 7, limits), v1::FINISH_REASON_STOP);
  EXPECT_EQ(FinishAfter(2, 5, limits), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(FinishAfter(2, 7, limits), v1::FINISH_REASON_STOP);  // both: the stop id says why
  limits.set_max_new_tokens(1);
  EXPECT_EQ(FinishAfter(0, 5, limits), v1::FINISH_REASON_LENGTH);
}

TEST(ToGeneratedToken, CarriesIdLogprobAndAlternativesInOrder) {
  const runtime::Sampled s{9, -0.25f, {{9, -0.25f}, {4, -1.5f}}};
  const v1::GeneratedToken t = ToGeneratedToken(3, s);
  EXPECT_EQ(t.index(), 3u);
  EXPECT_EQ(t.token_id(), 9u);
  EXPECT_EQ(t.logprob(), -0.25f);
  ASSERT_EQ(t.top_logprobs_size(), 2);
  EXPECT_EQ(t.top_logprobs(1).token_id(), 4u);
  EXPECT_EQ(t.top_logprobs(1).logprob(), -1.5f);
}

}  // namespace
}  // namespace kvtier::serving
