#include "load/fidelity/teacher_forced.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "services/base/status.h"
#include "services/cli/remote_generate.h"
#include "services/runtime/sampler.h"

namespace kvtier::fidelity {
namespace {

size_t ArgMax(std::span<const float> v) { return static_cast<size_t>(std::ranges::max_element(v) - v.begin()); }

// Blocks of this many tokens never fill in a window: every latent stays in
// float.
constexpr uint32_t kNeverSealed = kernels::kMaxBlockTokens;

}  // namespace

double Scores::Perplexity() const { return positions == 0 ? NAN : std::exp(nll_sum / static_cast<double>(positions)); }
double Scores::MeanKl() const { return positions == 0 ? NAN : kl_sum / static_cast<double>(positions); }
double Scores::Top1Agreement() const {
  return positions == 0 ? NAN : static_cast<double>(top1_agree) / static_cast<double>(positions);
}

void Scores::Add(std::span<const float> reference, std::span<const float> logprobs, uint32_t next) {
  ++positions;
  nll_sum -= logprobs[next];
  double kl = 0;
  for (size_t i = 0; i < reference.size(); ++i) {
    const double p = std::exp(double{reference[i]});
    if (p > 0) kl += p * (double{reference[i]} - double{logprobs[i]});
  }
  kl_sum += std::max(0.0, kl);
  top1_agree += ArgMax(reference) == ArgMax(logprobs);
}

std::span<const uint32_t> Windows::operator[](size_t i) const {
  const size_t begin = i * window;
  return ids.subspan(begin, std::min(window, ids.size() - begin));
}

size_t Windows::positions() const {
  size_t n = 0;
  for (size_t i = 0; i < count(); ++i) n += (*this)[i].size() - 1;
  return n;
}

void LogSoftmax(std::span<const float> logits, std::span<float> out) {
  const double log_sum = runtime::LogSumExp(logits);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<float>(logits[i] - log_sum);
}

absl::StatusOr<std::vector<Scores>> ScoreInProcess(const runtime::Model& model, const Windows& text,
                                                   uint32_t tokens_per_block, std::span<const kernels::Codec> codecs,
                                                   size_t keep_positions, std::vector<std::vector<float>>* kept) {
  if (text.window < 2 || text.window > kNeverSealed || text.ids.size() < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("need a window of 2..", kNeverSealed, " tokens and a text of 2 or more"));
  }
  const size_t vocab = static_cast<size_t>(model.config().vocab_size);
  const size_t runs = codecs.size() + 1;  // float first
  std::vector<Scores> scores(runs);
  scores[0].name = "float";
  for (size_t c = 0; c < codecs.size(); ++c) scores[c + 1].name = kernels::CodecName(codecs[c]);
  if (kept != nullptr) kept->assign(runs, {});
  size_t position = 0;
  std::vector<float> logits(runs * vocab), logprobs(runs * vocab);
  for (size_t w = 0; w < text.count(); ++w) {
    const std::span<const uint32_t> ids = text[w];
    std::vector<runtime::SequenceCache> caches;
    caches.push_back(model.NewCache(kernels::Codec::kBf16, kNeverSealed));
    for (kernels::Codec codec : codecs) caches.push_back(model.NewCache(codec, tokens_per_block));
    for (size_t t = 0; t + 1 < ids.size(); ++t) {
      std::vector<runtime::SequenceTokens> batch;
      for (size_t r = 0; r < runs; ++r) {
        batch.push_back({ids.subspan(t, 1), &caches[r], std::span(logits).subspan(r * vocab, vocab)});
      }
      KVTIER_RETURN_IF_ERROR(model.Forward(batch));
      for (size_t r = 0; r < runs; ++r) {
        LogSoftmax(std::span(logits).subspan(r * vocab, vocab), std::span(logprobs).subspan(r * vocab, vocab));
      }
      const std::span<const float> reference = std::span(logprobs).first(vocab);
      for (size_t r = 0; r < runs; ++r)
        scores[r].Add(reference, std::span(logprobs).subspan(r * vocab, vocab), ids[t + 1]);
      if (kept != nullptr && position < keep_positions) {
        for (size_t r = 0; r < runs; ++r) {
          (*kept)[r].insert((*kept)[r].end(), logprobs.begin() + r * vocab, logprobs.begin() + (r + 1) * vocab);
        }
      }
      ++position;
    }
  }
  return scores;
}

absl::StatusOr<std::vector<float>> LogprobsAsServed(const runtime::Model& model, const Windows& text,
                                                    uint32_t tokens_per_block, kernels::Codec codec, size_t positions) {
  if (tokens_per_block == 0) return absl::InvalidArgumentError("need blocks of 1 or more tokens");
  positions = std::min(positions, text.positions());
  const size_t vocab = static_cast<size_t>(model.config().vocab_size);
  std::vector<float> logits(vocab), out(positions * vocab);
  size_t position = 0;
  for (size_t w = 0; w < text.count() && position < positions; ++w) {
    const std::span<const uint32_t> ids = text[w];
    for (size_t t = 0; t + 1 < ids.size() && position < positions; ++t, ++position) {
      runtime::SequenceCache cache = model.NewCache(codec, tokens_per_block);
      const size_t cached = t / tokens_per_block * tokens_per_block;
      for (size_t b = 0; b < cached; b += tokens_per_block) {
        KVTIER_RETURN_IF_ERROR(model.Prefill(ids.subspan(b, tokens_per_block), cache, logits));
      }
      KVTIER_RETURN_IF_ERROR(model.Prefill(ids.subspan(cached, t + 1 - cached), cache, logits));
      LogSoftmax(logits, std::span(out).subspan(position * vocab, vocab));
    }
  }
  return out;
}

absl::StatusOr<Scores> ScoreServed(const std::string& prefill_target, const Windows& text, size_t positions,
                                   uint32_t vocab_size, std::span<const float> reference,
                                   std::span<const float> compare_to, uint64_t* cached_tokens,
                                   Scores* reference_scores) {
  positions = std::min(positions, text.positions());
  if (reference.size() < positions * vocab_size ||
      (!compare_to.empty() && compare_to.size() < positions * vocab_size)) {
    return absl::InvalidArgumentError("the reference has fewer positions than asked for");
  }
  Scores scores;
  scores.name = "served";
  if (cached_tokens != nullptr) *cached_tokens = 0;
  if (reference_scores != nullptr) *reference_scores = Scores{.name = "float"};
  std::vector<float> logprobs(vocab_size);
  size_t position = 0;
  for (size_t w = 0; w < text.count() && position < positions; ++w) {
    const std::span<const uint32_t> ids = text[w];
    for (size_t t = 0; t + 1 < ids.size() && position < positions; ++t, ++position) {
      v1::GenerateRequest request;
      request.set_request_id(absl::StrCat("fidelity-", position));
      for (size_t i = 0; i <= t; ++i) request.add_prompt_token_ids(ids[i]);
      request.mutable_limits()->set_max_new_tokens(1);
      request.mutable_limits()->set_top_logprobs(vocab_size);
      absl::StatusOr<cli::RemoteGeneration> out = cli::GenerateRemotely(prefill_target, request, absl::Seconds(60));
      if (!out.ok()) return out.status();
      if (out->tokens.size() != 1 || out->tokens[0].top.size() != vocab_size) {
        return absl::FailedPreconditionError(absl::StrCat(
            "position ", position, ": the prefill node sent ", out->tokens.empty() ? 0 : out->tokens[0].top.size(),
            " logprobs, not ", vocab_size, " (start it with --max-top-logprobs ", vocab_size, ")"));
      }
      for (const auto& [id, lp] : out->tokens[0].top) {
        if (id >= vocab_size) return absl::OutOfRangeError(absl::StrCat("token ", id, " outside the vocabulary"));
        logprobs[id] = lp;
      }
      const std::span<const float> ref = reference.subspan(position * vocab_size, vocab_size);
      scores.Add(ref, logprobs, ids[t + 1]);
      if (reference_scores != nullptr) reference_scores->Add(ref, ref, ids[t + 1]);
      if (!compare_to.empty()) {
        const std::span<const float> want = compare_to.subspan(position * vocab_size, vocab_size);
        for (size_t i = 0; i < vocab_size; ++i) {
          scores.max_logprob_difference =
              std::max(scores.max_logprob_difference, std::fabs(double{logprobs[i]} - double{want[i]}));
        }
      }
      if (cached_tokens != nullptr) *cached_tokens += out->usage.cached_tokens();
    }
  }
  return scores;
}

}  // namespace kvtier::fidelity
