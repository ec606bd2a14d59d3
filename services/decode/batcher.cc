#include "services/decode/batcher.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "services/base/log.h"
#include "services/runtime/cache_mark.h"
#include "services/serving/generated_tokens.h"

namespace kvtier::decode {

void Post(DecodeSequence& s, v1::DecodeResponse event, bool last) {
  std::function<void()> wake;
  {
    absl::MutexLock lock(&s.mu);
    s.events.push_back(std::move(event));
    s.done = s.done || last;
    wake = s.on_event;
  }
  if (wake) wake();
}

void Fail(DecodeSequence& s, absl::Status error) {
  std::function<void()> wake;
  {
    absl::MutexLock lock(&s.mu);
    s.error = std::move(error);
    s.done = true;
    wake = s.on_event;
  }
  if (wake) wake();
}

Batcher::Batcher(const runtime::Model& model, Options options, BlockSealed on_sealed, Ending on_ending,
                 StepDone on_step)
    : model_(model),
      options_(options),
      on_sealed_(std::move(on_sealed)),
      on_ending_(std::move(on_ending)),
      on_step_(std::move(on_step)),
      thread_([this] { Loop(); }) {}

Batcher::~Batcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  for (auto& s : sequences_) Fail(*s, absl::UnavailableError("the decode worker is shutting down"));
}

absl::Status Batcher::Submit(std::shared_ptr<DecodeSequence> sequence) {
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the decode worker is shutting down");
  if (sequences_.size() >= options_.max_sequences) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the decode worker holds its maximum of ", options_.max_sequences, " sequences"));
  }
  sequences_.push_back(std::move(sequence));
  return absl::OkStatus();
}

void Batcher::Loop() {
  for (;;) {
    std::vector<std::shared_ptr<DecodeSequence>> batch;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !sequences_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      // Drop what finished or was cancelled; then a window of at most
      // max_batch, rotating so that every sequence gets its turn.
      std::erase_if(sequences_, [](const std::shared_ptr<DecodeSequence>& s) {
        absl::MutexLock lock(&s->mu);
        return s->done || s->cancelled;
      });
      if (sequences_.empty()) continue;
      const size_t n = std::min(options_.max_batch, sequences_.size());
      next_turn_ %= sequences_.size();
      for (size_t i = 0; i < n; ++i) batch.push_back(sequences_[(next_turn_ + i) % sequences_.size()]);
      next_turn_ += n;
    }
    Step(batch);
  }
}

void Batcher::Step(const std::vector<std::shared_ptr<DecodeSequence>>& batch) {
  const auto start = std::chrono::steady_clock::now();
  Advance(batch);
  on_step_(batch.size(), std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

void Batcher::Advance(const std::vector<std::shared_ptr<DecodeSequence>>& batch) {
  const size_t vocab = static_cast<size_t>(model_.config().vocab_size);
  logits_.resize(batch.size() * vocab);
  const auto logits = [&](size_t i) { return std::span(logits_).subspan(i * vocab, vocab); };
  std::vector<runtime::SequenceTokens> rows;
  std::vector<size_t> sealed_before;
  std::vector<runtime::CacheMark> marks;
  for (size_t i = 0; i < batch.size(); ++i) {
    rows.push_back({std::span(&batch[i]->next_input, 1), &batch[i]->cache, logits(i)});
    sealed_before.push_back(runtime::FullBlocks(batch[i]->cache));
    if (batch.size() > 1) marks.push_back(runtime::MarkCache(batch[i]->cache, 1, model_.config()));
  }
  if (absl::Status s = model_.Forward(rows); !s.ok()) {
    // Rows do not mix: a sequence whose own latents break the pass (values
    // out of the model's range, say, from a request's tail: the kernels
    // answer INVALID_ARGUMENT) must not fail the others. Undo the step and
    // take each sequence alone, so that only the one at fault fails. (A
    // device error keeps its own code.)
    if (batch.size() == 1) {
      const bool its_values = s.code() == absl::StatusCode::kInvalidArgument;
      Fail(*batch[0], absl::Status(s.code(), absl::StrCat("decode step failed for this sequence alone: ", s.message(),
                                                          its_values ? " (its latents, from the request's tail or "
                                                                       "blocks, lead to values the model cannot carry)"
                                                                     : "")));
      return;
    }
    Log(LogLevel::kWarning, "batch",
        absl::StrCat("a step of ", batch.size(), " sequences failed (", s.message(), "); running them one at a time"));
    for (size_t i = 0; i < batch.size(); ++i)
      runtime::UndoToMark(batch[i]->cache, std::move(marks[i]), model_.config());
    for (const auto& sequence : batch) Advance({sequence});
    return;
  }
  // Every sequence's token at once, over the kernel threads (at a real
  // vocabulary sampling is real CPU work, whatever device ran the step).
  std::vector<runtime::SampleRequest> requests;
  for (size_t i = 0; i < batch.size(); ++i) {
    const DecodeSequence& s = *batch[i];
    requests.push_back({logits(i), &s.sampling, s.next_index, s.limits.top_logprobs()});
  }
  const std::vector<runtime::Sampled> tokens = runtime::SampleEach(requests);
  for (size_t i = 0; i < batch.size(); ++i) {
    DecodeSequence& s = *batch[i];
    s.tokens.push_back(s.next_input);
    for (size_t b = sealed_before[i]; b < runtime::FullBlocks(s.cache); ++b) on_sealed_(s, b);
    const runtime::Sampled& sampled = tokens[i];
    v1::DecodeResponse event;
    *event.mutable_token() = serving::ToGeneratedToken(s.next_index, sampled);
    const v1::FinishReason reason = serving::FinishAfter(s.next_index, sampled.token, s.limits);
    ++s.next_index;
    s.next_input = sampled.token;
    Post(s, std::move(event), false);
    if (reason != v1::FINISH_REASON_UNSPECIFIED) {
      on_ending_(s);
      v1::DecodeResponse finished;
      finished.mutable_finished()->set_reason(reason);
      finished.mutable_finished()->mutable_usage()->set_generated_tokens(s.next_index);
      Post(s, std::move(finished), true);
    }
  }
}

}  // namespace kvtier::decode
