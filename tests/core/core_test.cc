#include <thread>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include "troupe/core/deadline.h"
#include "troupe/core/log.h"
#include "troupe/core/random.h"
#include "troupe/core/status.h"

namespace troupe {
namespace {

Result<int> ParsePositive(int v) {
  if (v <= 0) return InvalidArgument("value {} is not positive", v);
  return v;
}

Status UsesAssign(int v, int* out) {
  TROUPE_ASSIGN_OR_RETURN(*out, ParsePositive(v));
  return Status::Ok();
}

TEST(Status, OkAndErrorsNameTheProblem) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = Timeout("peer {} silent for {} ms", "reward-0", 3000);
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Code::kTimeout);
  EXPECT_EQ(s.ToString(), "timeout: peer reward-0 silent for 3000 ms");
  EXPECT_EQ(s.WithContext("send").message(), "send: peer reward-0 silent for 3000 ms");
}

TEST(Status, ResultAndMacros) {
  int out = 0;
  EXPECT_TRUE(UsesAssign(5, &out).ok());
  EXPECT_EQ(out, 5);
  Status bad = UsesAssign(-1, &out);
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  EXPECT_NE(bad.message().find("-1"), std::string::npos);
}

TEST(Deadline, RemainingIsClamped) {
  auto d = Deadline::InMs(0);
  std::this_thread::yield();
  EXPECT_EQ(d.remaining_ms_or_minus1(), 0);
  EXPECT_EQ(Deadline::Never().remaining_ms_or_minus1(), -1);
  EXPECT_FALSE(Deadline::InMs(60000).expired());
}

TEST(Log, EveryLineCarriesTheActorName) {
  std::ostringstream out;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  log::Init("rollout-7", log::Options{spdlog::level::info, /*to_stderr=*/false});
  log::AddSink(sink);
  log::Get("engine").info("hello {}", 42);
  log::Get("transport").warn("careful");
  log::Flush();
  log::RemoveSink(sink);
  std::string text = out.str();
  EXPECT_NE(text.find("[rollout-7] engine: hello 42"), std::string::npos) << text;
  EXPECT_NE(text.find("[rollout-7] transport: careful"), std::string::npos) << text;
}

TEST(Log, EveryNRateLimits) {
  log::EveryN every(std::chrono::hours(1));
  EXPECT_TRUE(every());
  EXPECT_FALSE(every());
  EXPECT_FALSE(every());
}

TEST(RandomHex, GivesLowercaseHexOfTwiceTheBytesAndNeverTheSameTwice) {
  auto a = RandomHex(32), b = RandomHex(32);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString();
  EXPECT_EQ(a->size(), 64u);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos) << *a;
  EXPECT_NE(*a, *b);  // 2^-256
  auto c = RandomHex(5);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->size(), 10u);
  auto none = RandomHex(0);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
}

}  // namespace
}  // namespace troupe
