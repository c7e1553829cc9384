// Helpers shared by the engine tests: temp dirs, small configs, seeds.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "../common/temp_dir.h"
#include "../common/test_seed.h"
#include "troupe/engine/model_config.h"

namespace troupe::engine::testing {

using test_support::TempDir;

// A small model that exercises every feature (GQA, untied head) and runs fast.
inline ModelConfig TinyConfig() {
  ModelConfig c;
  c.vocab_size = 23;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.ffn_dim = 48;
  c.max_seq_len = 48;
  c.tie_word_embeddings = false;
  return c;
}

// Seed for a test: fixed per run but printed, so a failure can be replayed.
inline uint64_t TestSeed() {
  return test_support::TestSeed("engine tests");
}

}  // namespace troupe::engine::testing
