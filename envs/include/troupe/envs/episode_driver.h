// Runs many multi-turn episodes concurrently on the generation engine.
//
//   EpisodeDriver::Run ──Submit(turn 1 of every episode)──▶ engine thread (continuous batching)
//        ▲    ◀──────────── callback: results queued ──────────┘
//        │  calling thread: TokenEpisode::OnAssistantTokens (parse call, run the tool)
//        └──Submit(ContinueRequest(result, env tokens)) for episodes still running
//
// Every assistant turn is one engine request (ContinueRequest carries the
// response so far with its masks, log-probs and versions), so the engine
// batches turns of different episodes together and a long episode never holds
// up the others: each episode is handed back (on_done) the moment it ends.
// Tools run on the thread that called Run, never on the engine thread.
//
// The header is torch-free (the engine is forward-declared); link
// troupe::envs_engine, which links troupe::engine.
//
// Thread safety: one Run at a time per driver (Run is not reentrant); Stats()
// and Cancel() may be called from any thread. Run blocks until every episode
// has ended, the deadline passes or Cancel() is called; then the episodes
// still running are aborted (their in-flight engine requests finish in the
// background and are discarded).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/core/thread_annotations.h"
#include "troupe/engine/engine_config.h"
#include "troupe/envs/episode.h"

namespace troupe::engine {
class Engine;
}

namespace troupe::envs {

struct EpisodeRequest {
  const Task* task = nullptr;  // a multi-turn task; borrowed, must outlive Run
  Prompt prompt;
  uint64_t seed = 0;  // sampling seed; turn k samples with a seed derived from (seed, k)
  uint64_t tag = 0;   // caller's id, copied into the outcome
  std::optional<EpisodeConfig> limits;  // overrides the driver's EpisodeConfig for this episode
};

struct EpisodeOutcome {
  uint64_t tag = 0;
  // Not ok when the episode could not start (prompt not encodable, no scratch
  // directory, single-turn task); `episode` is then null.
  Status status;
  // The finished episode: response ids, behaviour log-probs, loss mask, texts, score, flags.
  std::unique_ptr<TokenEpisode> episode;
  // Per response token: the policy version that sampled it (0 for environment tokens).
  std::vector<uint64_t> token_versions;
  // Policy version at the first turn's prefill (tag batches with it).
  uint64_t policy_version = 0;
};

struct EpisodeDriverConfig {
  // Turn and token limits of every episode (per-request `limits` override it).
  EpisodeConfig episode;
  // Sampling of every turn: temperature, top_k, top_p. The driver sets
  // max_new_tokens (the turn budget), stop_token_ids (EOS), num_samples (1)
  // and seed per turn.
  engine::SamplingParams sampling;

  Status Validate() const;
};

// Counters over every episode the driver has run.
struct EpisodeDriverStats {
  uint64_t episodes = 0;
  uint64_t start_failures = 0;
  uint64_t submitted = 0;
  uint64_t turn_limit = 0;
  uint64_t token_limit = 0;
  uint64_t aborted = 0;
  uint64_t turns = 0;
  double score_sum = 0;
  EpisodeFlags flags;

  // (name, value) pairs for metrics ("episodes.submitted", "episodes.flags.unknown_tools", ...).
  std::vector<std::pair<std::string, double>> AsStats() const;
};

class EpisodeDriver {
 public:
  // Borrows the engine and the renderer (whose tokenizer must match the model).
  EpisodeDriver(engine::Engine& engine, const Renderer& renderer, EpisodeDriverConfig config);

  // Called on Run's thread as each episode ends, with its index in `requests`.
  using OnDone = std::function<void(size_t index, const EpisodeOutcome& outcome)>;

  // Runs all episodes concurrently; outcomes in input order. See the top comment.
  std::vector<EpisodeOutcome> Run(std::vector<EpisodeRequest> requests, Deadline deadline,
                                  const OnDone& on_done = nullptr);

  EpisodeDriverStats Stats() const;

  // Ends the Run in progress as its deadline would (running episodes are
  // aborted with reason "cancelled", Run returns promptly without touching the
  // engine again) and makes every later Run abort its episodes at once. For
  // shutdown: after Cancel() and the return of Run, the engine may be
  // destroyed. Never blocks; any thread.
  void Cancel();

 private:
  struct Inbox;  // results handed from the engine thread to Run (episode_driver.cc)

  engine::Engine& engine_;
  const Renderer& renderer_;
  EpisodeDriverConfig config_;
  mutable Mutex mu_;
  EpisodeDriverStats stats_ TROUPE_GUARDED_BY(mu_);
  bool cancelled_ TROUPE_GUARDED_BY(mu_) = false;
  std::shared_ptr<Inbox> running_ TROUPE_GUARDED_BY(mu_);  // the Run in progress, if any
};

}  // namespace troupe::envs
