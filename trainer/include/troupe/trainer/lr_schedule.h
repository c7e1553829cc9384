// Learning-rate schedule: linear warmup, then cosine decay to a floor. Torch-free.
//
//   lr(s) = peak * (s + 1) / warmup                            s < warmup
//   lr(s) = peak * (m + (1 - m) * (1 + cos(pi * p)) / 2)       warmup <= s < total
//           with p = (s - warmup) / (total - warmup), m = min_lr_ratio
//   lr(s) = peak * m                                           s >= total
//
// s counts optimizer updates from 0 (the update about to be made). The first
// update uses peak/warmup rather than 0 so no update is wasted. Pure function
// of its inputs; thread-safe.
#pragma once

#include <cstdint>

namespace troupe::trainer {

struct LrSchedule {
  double peak_lr = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;

  double At(int64_t step) const;
};

}  // namespace troupe::trainer
