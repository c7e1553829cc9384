#include "troupe/trainer/lr_schedule.h"

#include <cmath>

namespace troupe::trainer {

double LrSchedule::At(int64_t step) const {
  if (step < 0) step = 0;
  if (step < warmup_steps) {
    return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  if (step >= total_steps) return peak_lr * min_lr_ratio;
  const int64_t span = total_steps - warmup_steps;
  if (span <= 0) return peak_lr * min_lr_ratio;
  const double p = static_cast<double>(step - warmup_steps) / static_cast<double>(span);
  const double cosine = 0.5 * (1.0 + std::cos(M_PI * p));
  return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

}  // namespace troupe::trainer
