// Shared pieces of the three roles (private to actors/).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "troupe/broadcast/adapter_layout.h"
#include "troupe/engine/model_config.h"
#include "troupe/engine/tokenizer.h"
#include "troupe/envs/renderer.h"
#include "troupe/envs/task.h"
#include "troupe/envs/tasks.h"
#include "troupe/launcher/job_config.h"
#include "troupe/transport/reliable.h"

namespace troupe::actors {

// Everything derived from the job config that several roles need.
struct JobContext {
  launcher::JobConfig job;
  std::string run_dir;
  std::string bind_host = "127.0.0.1";           // address this actor binds and advertises
  std::unique_ptr<engine::Tokenizer> tokenizer;  // tokenizer.kind: char or hf
  std::unique_ptr<envs::Renderer> renderer;      // the chat template of the model folder, or a fixed format
  std::vector<int32_t> stop_ids;                 // ids that end a reply (EOS, generation_config.json's)
  std::shared_ptr<const envs::TaskRegistry> tasks;
  std::vector<const envs::Task*> task_list;  // in config order
  // The job's bearer token for the rollout actors' generation endpoints (one per job, from
  // the launcher; RoleArgs::endpoint_token). "" when the job has no agent servers.
  std::string endpoint_token;

  // "tcp://<bind_host>:0"
  std::string AnyPort() const { return "tcp://" + bind_host + ":0"; }
};

// Builds tokenizer, renderer and tasks from a validated job config.
Result<std::unique_ptr<JobContext>> MakeJobContext(launcher::JobConfig job,
                                                   const std::string& run_dir,
                                                   const std::string& bind_host);

// A 64-bit seed derived from the job seed and a label (actor id, purpose).
uint64_t DeriveSeed(uint64_t job_seed, const std::string& label, uint64_t salt = 0);

// Seconds since an epoch (steady clock).
inline double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Exponentially smoothed rate (events per second) over ~1 s windows.
class RateMeter {
 public:
  void Add(double n) { pending_ += n; }
  // Folds what was added since the last call into the rate; returns it.
  double Update();
  double rate() const { return rate_; }

 private:
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  double pending_ = 0, rate_ = 0;
  bool first_ = true;
};

// The LoRA adapters a model built from `model` has (rank 0: none), declared by the learner's
// weight sender and each rollout actor's receiver: a mismatch is refused at registration.
broadcast::AdapterLayout AdapterLayoutOf(const engine::ModelConfig& model);

// Delivery figures for heartbeats (`troupe status --stats`): the receiver's
// dedupes and deliveries ("receiver.*") and the sender's outbox ("sender.*").
void AddDeliveryStats(const transport::ReliableReceiverStats* received,
                      const transport::ReliableSenderStats* sent,
                      std::map<std::string, double>* stats);

}  // namespace troupe::actors
