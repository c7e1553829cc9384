// AdapterLayout: what LoRA adapters a side of the weight broadcast trains or can apply,
// exchanged at registration so a mismatch is refused at group formation (torch-free).
//
//   learner (BroadcastConfig::adapters) ◀── Register{adapters} ── receiver (ReceiverConfig::adapters)
//        CheckAdapterLayouts(learner, receiver) fails ─▶ refused: the receiver never joins
//
// A learner training LoRA r=16 on q_proj,v_proj refuses an engine with no lora config, another
// rank, alpha or target set, or adapter tensors of other names or shapes (another base model);
// a full-weights learner refuses a LoRA engine (it would refuse every update without adapters).
// A side that does not declare a layout (declared = false) is not checked here: the first
// transfer checks it, as before. Plain value types, no thread-safety concerns.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "troupe/core/status.h"

namespace troupe::broadcast {

struct AdapterTensor {
  std::string name;            // PEFT name ("base_model.model.model.layers.0...lora_A.weight")
  std::vector<int64_t> shape;  // [rank, in] for lora_A, [out, rank] for lora_B
};

struct AdapterLayout {
  // False (default): this side says nothing about its adapters (not checked at registration).
  bool declared = false;
  // LoRA rank; 0 = no lora config (the full weights train and travel).
  int64_t rank = 0;
  // Effective alpha (scale = alpha / rank).
  double alpha = 0;
  // PEFT module names with an adapter, in lora.h order.
  std::vector<std::string> targets;
  // Every adapter tensor, in the model's order.
  std::vector<AdapterTensor> tensors;

  // "LoRA r=16 alpha=32 on q_proj,v_proj" or "no lora config".
  std::string Describe() const;
};

// Ok when a receiver declaring `engine` can apply what a learner declaring `learner` sends
// (or either side declares nothing). Otherwise InvalidArgument naming the receiver and the
// mismatch: "rollout-2: learner trains LoRA r=16 alpha=16 on q_proj,v_proj; engine has no lora
// config".
Status CheckAdapterLayouts(const AdapterLayout& learner, const AdapterLayout& engine,
                           const std::string& receiver_id);

}  // namespace troupe::broadcast
