#include "troupe/envs/episode_driver.h"

#include <deque>

#include "rng.h"
#include "troupe/core/check.h"
#include "troupe/core/log.h"
#include "troupe/engine/engine.h"

namespace troupe::envs {

// Results the engine thread hands to Run's thread. Shared with the callbacks,
// which may outlive Run (after a deadline), hence the shared_ptr.
struct EpisodeDriver::Inbox {
  Mutex mu;
  CondVar cv;
  std::deque<std::pair<size_t, std::vector<engine::GenerationResult>>> ready TROUPE_GUARDED_BY(mu);
  bool cancelled TROUPE_GUARDED_BY(mu) = false;  // Cancel() was called
};

Status EpisodeDriverConfig::Validate() const {
  TROUPE_RETURN_IF_ERROR(episode.Validate());
  engine::SamplingParams s = sampling;
  s.max_new_tokens = 1;
  s.num_samples = 1;
  return s.Validate();
}

std::vector<std::pair<std::string, double>> EpisodeDriverStats::AsStats() const {
  std::vector<std::pair<std::string, double>> out = {
      {"episodes.count", static_cast<double>(episodes)},
      {"episodes.start_failures", static_cast<double>(start_failures)},
      {"episodes.submitted", static_cast<double>(submitted)},
      {"episodes.turn_limit", static_cast<double>(turn_limit)},
      {"episodes.token_limit", static_cast<double>(token_limit)},
      {"episodes.aborted", static_cast<double>(aborted)},
      {"episodes.turns_mean",
       episodes ? static_cast<double>(turns) / static_cast<double>(episodes) : 0.0},
      {"episodes.score_mean", episodes ? score_sum / static_cast<double>(episodes) : 0.0}};
  for (const auto& [k, v] : flags.AsStats()) out.emplace_back("episodes.flags." + k, v);
  return out;
}

EpisodeDriver::EpisodeDriver(engine::Engine& engine, const Renderer& renderer,
                             EpisodeDriverConfig config)
    : engine_(engine), renderer_(renderer), config_(std::move(config)) {}

EpisodeDriverStats EpisodeDriver::Stats() const {
  MutexLock lock(mu_);
  return stats_;
}

void EpisodeDriver::Cancel() {
  std::shared_ptr<Inbox> inbox;
  {
    MutexLock lock(mu_);
    cancelled_ = true;
    inbox = running_;
  }
  if (!inbox) return;
  MutexLock lock(inbox->mu);
  inbox->cancelled = true;
  inbox->cv.notify_all();
}

std::vector<EpisodeOutcome> EpisodeDriver::Run(std::vector<EpisodeRequest> requests,
                                               Deadline deadline, const OnDone& on_done) {
  const size_t n = requests.size();
  std::vector<EpisodeOutcome> out(n);
  std::vector<int64_t> turns(n, 0);
  std::vector<bool> finished(n, false);
  auto inbox = std::make_shared<Inbox>();
  bool cancelled = false;
  {
    MutexLock lock(mu_);
    running_ = inbox;
    cancelled = cancelled_;
  }
  if (cancelled) {
    MutexLock lock(inbox->mu);
    inbox->cancelled = true;
  }
  const int64_t cache_len = engine_.config().CacheLen();
  size_t running = 0;

  auto finish = [&](size_t i) {
    finished[i] = true;
    EpisodeOutcome& o = out[i];
    {
      MutexLock lock(mu_);
      ++stats_.episodes;
      if (!o.episode) {
        ++stats_.start_failures;
      } else {
        const Episode& ep = o.episode->episode();
        o.token_versions.resize(o.episode->response_tokens().size(), 0);
        stats_.submitted += ep.end() == EpisodeEnd::kSubmitted;
        stats_.turn_limit += ep.end() == EpisodeEnd::kTurnLimit;
        stats_.token_limit += ep.end() == EpisodeEnd::kTokenLimit;
        stats_.aborted += ep.end() == EpisodeEnd::kAborted;
        stats_.turns += static_cast<uint64_t>(ep.turns());
        stats_.score_sum += ep.score().reward;
        stats_.flags += ep.flags();
      }
    }
    if (on_done) on_done(i, o);
  };

  // Submits the next turn of episode i; false (episode ended) when it cannot run.
  auto submit = [&](size_t i, engine::GenerateRequest req) {
    TokenEpisode& ep = *out[i].episode;
    int64_t context = static_cast<int64_t>(req.prompt.size() + req.response_prefix.size());
    int64_t budget = std::min(ep.next_turn_budget(), cache_len - 1 - context);
    if (budget <= 0) {
      ep.Finish(EpisodeEnd::kTokenLimit, "the engine's context is full");
      return false;
    }
    req.sampling = config_.sampling;
    req.sampling.max_new_tokens = static_cast<int32_t>(budget);
    req.sampling.stop_token_ids = {renderer_.tokenizer().eos_id()};
    req.sampling.num_samples = 1;
    req.sampling.seed = detail::Mix({requests[i].seed, static_cast<uint64_t>(turns[i])});
    req.tag = i;
    Status s = engine_.Submit(std::move(req), [inbox, i](std::vector<engine::GenerationResult> r) {
      MutexLock lock(inbox->mu);
      inbox->ready.emplace_back(i, std::move(r));
      inbox->cv.notify_one();
    });
    if (!s.ok()) {
      ep.Abort("engine refused the turn: " + s.message());
      return false;
    }
    return true;
  };

  for (size_t i = 0; i < n; ++i) {
    EpisodeRequest& r = requests[i];
    out[i].tag = r.tag;
    if (!r.task) {
      out[i].status = InvalidArgument("episode request {} has no task", i);
      finish(i);
      continue;
    }
    auto ep = TokenEpisode::Start(*r.task, r.prompt, r.limits.value_or(config_.episode), renderer_);
    if (!ep.ok()) {
      out[i].status = ep.status();
      finish(i);
      continue;
    }
    out[i].episode = std::move(ep).value();
    engine::GenerateRequest first;
    first.prompt = out[i].episode->prompt_tokens();
    if (cancelled) {
      out[i].episode->Abort("cancelled");
      finish(i);
    } else if (submit(i, std::move(first))) {
      ++running;
    } else {
      finish(i);
    }
  }

  while (running > 0) {
    std::deque<std::pair<size_t, std::vector<engine::GenerationResult>>> batch;
    {
      MutexLock lock(inbox->mu);
      inbox->cv.wait_until(lock, deadline.at(), [&]() TROUPE_NO_THREAD_SAFETY_ANALYSIS {
        return !inbox->ready.empty() || inbox->cancelled;
      });
      cancelled = inbox->cancelled;
      if (!cancelled) batch.swap(inbox->ready);
    }
    if (batch.empty()) {  // deadline passed or cancelled
      for (size_t i = 0; i < n; ++i) {
        if (finished[i]) continue;
        out[i].episode->Abort(cancelled ? "cancelled" : "deadline passed");
        finish(i);
      }
      break;
    }
    for (auto& [i, results] : batch) {
      if (finished[i]) continue;
      TokenEpisode& ep = *out[i].episode;
      TROUPE_CHECK_EQ(results.size(), 1u);
      engine::GenerationResult& r = results[0];
      if (turns[i]++ == 0) out[i].policy_version = r.policy_version;
      if (r.finish_reason == engine::FinishReason::kRejected ||
          r.finish_reason == engine::FinishReason::kAborted) {
        ep.Abort(fmt::format("engine {} the turn: {}", engine::FinishReasonName(r.finish_reason),
                             r.reject_reason));
        --running;
        finish(i);
        continue;
      }
      auto k = static_cast<size_t>(r.num_new_tokens);
      TROUPE_CHECK_EQ(r.response_ids.size(), ep.response_tokens().size() + k);
      std::vector<int32_t> tokens(r.response_ids.end() - static_cast<std::ptrdiff_t>(k),
                                  r.response_ids.end());
      std::vector<float> logprobs(r.logprobs.end() - static_cast<std::ptrdiff_t>(k),
                                  r.logprobs.end());
      out[i].token_versions = r.token_versions;
      Result<TokenEpisode::Step> step = ep.OnAssistantTokens(tokens, logprobs);
      if (!step.ok()) {
        TROUPE_LOG_EVERY_MS(log::Get("envs"), spdlog::level::warn, 5000, "episode {} aborted: {}",
                            ep.episode().prompt().id, step.status().ToString());
      }
      if (!step.ok() || step->done ||
          !submit(i, engine::ContinueRequest(r, step->env_tokens, config_.sampling))) {
        --running;
        finish(i);
      }
    }
  }
  MutexLock lock(mu_);
  running_.reset();
  return out;
}

}  // namespace troupe::envs
