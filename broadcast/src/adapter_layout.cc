// Registration-time adapter check of the weight broadcast (adapter_layout.h).
#include "troupe/broadcast/adapter_layout.h"

#include <map>

#include <fmt/format.h>

namespace troupe::broadcast {
namespace {

std::string Shape(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

}  // namespace

std::string AdapterLayout::Describe() const {
  if (rank <= 0) return "no lora config";
  return fmt::format("LoRA r={} alpha={:g} on {}", rank, alpha, fmt::join(targets, ","));
}

Status CheckAdapterLayouts(const AdapterLayout& learner, const AdapterLayout& engine,
                           const std::string& receiver_id) {
  if (!learner.declared || !engine.declared) return Status::Ok();
  if (learner.rank <= 0 && engine.rank <= 0) return Status::Ok();
  auto refuse = [&](const std::string& detail) {
    const std::string trains =
        learner.rank > 0 ? "trains " + learner.Describe() : "trains full weights (no lora config)";
    const std::string has = engine.rank > 0 ? "has " + engine.Describe() : "has no lora config";
    return InvalidArgument("{}: learner {}; engine {}{}", receiver_id, trains, has, detail);
  };
  if (engine.rank <= 0) return refuse("");
  if (learner.rank <= 0) return refuse(" (it refuses every update without adapters)");
  if (engine.rank != learner.rank) return refuse(" (rank differs)");
  if (engine.alpha != learner.alpha) return refuse(" (alpha differs)");
  if (engine.targets != learner.targets) return refuse(" (target modules differ)");
  std::map<std::string, const AdapterTensor*> mine;
  for (const auto& t : engine.tensors) mine[t.name] = &t;
  for (const auto& t : learner.tensors) {
    auto it = mine.find(t.name);
    if (it == mine.end()) return refuse(fmt::format(" (the engine has no tensor '{}')", t.name));
    if (it->second->shape != t.shape)
      return refuse(fmt::format(" (tensor '{}': learner {}, engine {})", t.name, Shape(t.shape),
                                Shape(it->second->shape)));
    mine.erase(it);
  }
  if (!mine.empty())
    return refuse(fmt::format(" (the learner sends no tensor '{}')", mine.begin()->first));
  return Status::Ok();
}

}  // namespace troupe::broadcast
