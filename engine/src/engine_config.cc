#include "troupe/engine/engine_config.h"

#include <cmath>

namespace troupe::engine {

Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0.0)
    return InvalidArgument("sampling.temperature = {} must be finite and >= 0", temperature);
  if (top_k < 0) return InvalidArgument("sampling.top_k = {} must be >= 0 (0 = off)", top_k);
  if (!std::isfinite(top_p) || top_p <= 0.0 || top_p > 1.0)
    return InvalidArgument("sampling.top_p = {} must be in (0, 1]", top_p);
  if (max_new_tokens < 1)
    return InvalidArgument("sampling.max_new_tokens = {} must be >= 1", max_new_tokens);
  if (num_samples < 1 || num_samples > 65536)
    return InvalidArgument("sampling.num_samples = {} must be in [1, 65536]", num_samples);
  for (int32_t id : stop_token_ids)
    if (id < 0) return InvalidArgument("sampling.stop_token_ids holds a negative id {}", id);
  return Status::Ok();
}

Status EngineConfig::Validate() const {
  TROUPE_RETURN_IF_ERROR(model.Validate());
  if (num_slots < 1 || num_slots > 65536)
    return InvalidArgument("engine.num_slots = {} must be in [1, 65536]", num_slots);
  if (max_seq_len < 0 || max_seq_len > model.max_seq_len)
    return InvalidArgument("engine.max_seq_len = {} must be in [0, model.max_seq_len = {}]",
                           max_seq_len, model.max_seq_len);
  if (CacheLen() < 2)
    return InvalidArgument("engine cache length {} must be >= 2 (one prompt and one new token)",
                           CacheLen());
  if (intra_op_threads < 0 || intra_op_threads > 1024)
    return InvalidArgument("engine.intra_op_threads = {} must be in [0, 1024]", intra_op_threads);
  TROUPE_RETURN_IF_ERROR(ValidateDeviceName("engine.device", device));
  if (max_prefill_tokens < CacheLen())
    return InvalidArgument(
        "engine.max_prefill_tokens = {} must be >= the cache length {} (one full prompt)",
        max_prefill_tokens, CacheLen());
  return Status::Ok();
}

Status ValidateDeviceName(std::string_view key, const std::string& device) {
  const bool indexed = device.rfind("cuda:", 0) == 0 && device.size() > 5 &&
                       device.find_first_not_of("0123456789", 5) == std::string::npos;
  if (device == "cpu" || device == "cuda" || indexed) return Status::Ok();
  return InvalidArgument("{} = '{}' must be 'cpu', 'cuda' or 'cuda:N'", key, device);
}

}  // namespace troupe::engine
