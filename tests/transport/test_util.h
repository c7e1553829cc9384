// Helpers shared by the transport tests.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../common/temp_dir.h"
#include "../common/test_seed.h"
#include "troupe/transport/message.h"
#include "troupe/transport/socket.h"

namespace troupe::transport::testing {

using test_support::TempDir;

// A seed printed once per test so failures can be replayed.
inline uint64_t TestSeed() {
  return test_support::TestSeed("transport tests");
}

// An Echo message carrying `text` and an int32 payload tensor of `n` values
// (v[i] = base + i), sent without copying.
inline OutMessage MakeEcho(const std::string& text, size_t n = 0, int32_t base = 0) {
  OutMessage m;
  auto echo = m.envelope().getBody().initEcho();
  echo.setText(text);
  if (n > 0) {
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<int32_t>(i);
    Status st = m.SetTensor(echo.initPayload(), wire::DType::INT32, {static_cast<int64_t>(n)},
                            TensorBytes::FromVector(std::move(v)));
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  return m;
}

inline std::string EchoText(const InMessage& m) {
  if (m.kind() != MessageKind::ECHO) return "<kind " + KindName(m.kind()) + ">";
  return m.envelope().getBody().getEcho().getText().cStr();
}

}  // namespace troupe::transport::testing
