#include "role_common.h"

namespace troupe::actors {

Result<std::unique_ptr<JobContext>> MakeJobContext(launcher::JobConfig job,
                                                   const std::string& run_dir,
                                                   const std::string& bind_host) {
  auto ctx = std::make_unique<JobContext>();
  ctx->job = std::move(job);
  ctx->run_dir = run_dir;
  ctx->bind_host = bind_host;
  TROUPE_ASSIGN_OR_RETURN(ctx->tokenizer, launcher::MakeTokenizer(ctx->job.tokenizer));
  TROUPE_ASSIGN_OR_RETURN(ctx->renderer,
                          envs::MakeRenderer(*ctx->tokenizer,
                                             launcher::TokenizerFolder(ctx->job.tokenizer),
                                             ctx->job.chat));
  TROUPE_ASSIGN_OR_RETURN(ctx->stop_ids, launcher::StopTokenIds(ctx->job, *ctx->tokenizer));
  TROUPE_ASSIGN_OR_RETURN(auto registry, envs::TaskRegistry::Create(ctx->job.tasks));
  ctx->tasks = registry;
  for (const auto& t : ctx->job.tasks) {
    const envs::Task* task = registry->Find(t.name);
    if (!task) return Internal("task '{}' missing from the registry", t.name);
    ctx->task_list.push_back(task);
  }
  return ctx;
}

uint64_t DeriveSeed(uint64_t job_seed, const std::string& label, uint64_t salt) {
  // FNV-1a over the label, mixed with the seeds (splitmix64 finaliser).
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : label) {
    h ^= c;
    h *= 1099511628211ull;
  }
  uint64_t z = h ^ (job_seed * 0x9E3779B97F4A7C15ull) ^ (salt + 0x632BE59BD9B4E019ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double RateMeter::Update() {
  auto now = std::chrono::steady_clock::now();
  double dt = std::chrono::duration<double>(now - last_).count();
  if (dt < 0.5) return rate_;
  double r = pending_ / dt;
  rate_ = first_ ? r : 0.5 * rate_ + 0.5 * r;
  first_ = false;
  pending_ = 0;
  last_ = now;
  return rate_;
}

void AddDeliveryStats(const transport::ReliableReceiverStats* received,
                      const transport::ReliableSenderStats* sent,
                      std::map<std::string, double>* stats) {
  auto& s = *stats;
  if (received) {
    s["receiver.delivered"] = static_cast<double>(received->delivered);
    s["receiver.duplicates"] = static_cast<double>(received->duplicates);
    s["receiver.out_of_order"] = static_cast<double>(received->out_of_order);
    s["receiver.reorder_overflow"] = static_cast<double>(received->reorder_overflow);
    s["receiver.rejected"] = static_cast<double>(received->rejected);
  }
  if (sent) {
    s["sender.outbox"] = static_cast<double>(sent->queued + sent->in_flight);
    s["sender.outbox_bytes"] = static_cast<double>(sent->outbox_bytes);
    s["sender.retransmits"] = static_cast<double>(sent->retransmits);
    s["sender.rerouted"] = static_cast<double>(sent->rerouted);
    s["sender.send_blocked"] = static_cast<double>(sent->send_blocked);
    s["sender.rejected"] = static_cast<double>(sent->rejected);
  }
}

broadcast::AdapterLayout AdapterLayoutOf(const engine::ModelConfig& model) {
  broadcast::AdapterLayout out;
  out.declared = true;
  if (!model.lora.enabled()) return out;
  out.rank = model.lora.rank;
  out.alpha = model.lora.effective_alpha();
  for (int m = 0; m < engine::kNumLoraModules; ++m)
    if (model.lora.Targets(m)) out.targets.push_back(engine::LoraModuleName(m));
  for (auto& [name, shape] : model.AdapterShapes())
    out.tensors.push_back(broadcast::AdapterTensor{name, std::move(shape)});
  return out;
}

}  // namespace troupe::actors
