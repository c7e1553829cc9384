#include <gtest/gtest.h>

#include "troupe/core/config_binder.h"
#include "troupe/launcher/job_spec.h"

namespace troupe::launcher {
namespace {

struct Inner {
  double lr = 1e-3;
  std::optional<int> lag;
};
void Describe(config::Binder& b, Inner& c) {
  b.Field("lr", &c.lr, "learning rate");
  b.Field("lag", &c.lag, "max lag");
}
struct Outer {
  std::string name = "job";
  uint32_t count = 2;
  bool flag = false;
  std::vector<std::string> tags;
  Inner inner;
  std::vector<HostSpec> hosts;
};
void Describe(config::Binder& b, Outer& c) {
  b.Field("name", &c.name, "job name");
  b.Field("count", &c.count, "count");
  b.Field("flag", &c.flag, "flag");
  b.Field("tags", &c.tags, "tags");
  b.Section("inner", &c.inner, "inner section");
  b.List("hosts", &c.hosts, "hosts");
}

TEST(ConfigBinder, ReadsTypedValuesAndKeepsDefaults) {
  Outer o;
  auto y = YAML::Load("name: x\ninner: {lr: 0.5}\ntags: [a, b]\nhosts: [{name: h1, port: 2222}]\n");
  ASSERT_TRUE(config::Read(y, "job.yaml", &o).ok());
  EXPECT_EQ(o.name, "x");
  EXPECT_EQ(o.count, 2u);
  EXPECT_DOUBLE_EQ(o.inner.lr, 0.5);
  EXPECT_FALSE(o.inner.lag.has_value());
  ASSERT_EQ(o.tags.size(), 2u);
  ASSERT_EQ(o.hosts.size(), 1u);
  EXPECT_EQ(o.hosts[0].port, 2222u);
}

TEST(ConfigBinder, ErrorsNameFileKeyAndProblem) {
  Outer o;
  auto y = YAML::Load("count: -3\ninner: {lr: abc, lagg: 2}\nflag: maybe\nnmae: z\n");
  Status s = config::Read(y, "job.yaml", &o);
  ASSERT_FALSE(s.ok());
  const std::string& m = s.message();
  EXPECT_NE(m.find("job.yaml: key 'count': expected a non-negative integer, got '-3'"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("job.yaml: key 'inner.lr': expected a finite number, got 'abc'"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("key 'inner.lagg': unknown key (did you mean 'inner.lag'?)"), std::string::npos)
      << m;
  EXPECT_NE(m.find("key 'flag': expected true or false"), std::string::npos) << m;
  EXPECT_NE(m.find("key 'nmae': unknown key (did you mean 'name'?)"), std::string::npos) << m;
}

TEST(ConfigBinder, OutOfRangeAndWrongShape) {
  Outer o;
  Status s = config::Read(YAML::Load("count: 99999999999\ninner: 3\n"), "f.yaml", &o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("key 'count': value 99999999999 is out of range"), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("key 'inner': expected a mapping"), std::string::npos) << s.message();
}

TEST(ConfigBinder, OverridesAndRoundTrip) {
  YAML::Node root = YAML::Load("name: x\n");
  ASSERT_TRUE(config::ApplyOverride(&root, "inner.lr=0.25").ok());
  ASSERT_TRUE(config::ApplyOverride(&root, "tags=[p, q]").ok());
  EXPECT_FALSE(config::ApplyOverride(&root, "noequals").ok());
  EXPECT_FALSE(config::ApplyOverride(&root, "name.sub=1").ok());  // name is a value
  Outer o;
  ASSERT_TRUE(config::Read(root, "x.yaml", &o).ok());
  EXPECT_DOUBLE_EQ(o.inner.lr, 0.25);
  Outer again;
  ASSERT_TRUE(config::Read(config::Write(o), "resolved", &again).ok());
  EXPECT_DOUBLE_EQ(again.inner.lr, 0.25);
  EXPECT_EQ(again.tags, o.tags);
}

TEST(ConfigBinder, EveryKeyDocumented) {
  auto docs = config::Document(Outer{});
  bool saw = false;
  for (auto& d : docs) {
    EXPECT_FALSE(d.doc.empty()) << d.path;
    if (d.path == "hosts[].port") saw = true;
  }
  EXPECT_TRUE(saw);
}

TEST(JobSpec, ValidatesHeadAndCluster) {
  HeadSpec h;
  Status s = config::Read(YAML::Load("heartbeat_interval_ms: 1000\nheartbeat_timeout_ms: 1500\n"),
                          "j.yaml", &h);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("heartbeat_timeout_ms"), std::string::npos);
  ClusterSpec c;
  s = config::Read(YAML::Load("backend: kubernetes\n"), "j.yaml", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("must be local, ssh or slurm, got 'kubernetes'"), std::string::npos);
}

}  // namespace
}  // namespace troupe::launcher
