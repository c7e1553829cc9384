// Unit tests of the remote backends' building blocks (no root, no daemons):
// placement rules, the remote launch/stop scripts (run by a real shell against
// real processes), marker parsing, and the head's advertise address.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "remote_spawner.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/spawner.h"
#include "troupe/launcher/subprocess.h"

namespace troupe::launcher {
namespace {

using remote::Placer;

HostSpec Host(const std::string& name, uint32_t slots = 8, std::vector<std::string> res = {}) {
  HostSpec h;
  h.name = name;
  h.address = "10.1.0." + std::to_string(name.back() - '0');
  h.slots = slots;
  h.resources = std::move(res);
  return h;
}

RoleProcess Role(uint32_t count, std::vector<std::string> hosts = {}, uint32_t per_node = 0,
                 std::vector<std::string> res = {}) {
  RoleProcess r;
  r.count = count;
  r.hosts = std::move(hosts);
  r.per_node = per_node;
  r.resources = std::move(res);
  return r;
}

TEST(PlacerTest, SpreadsARoleOverItsHostsInConfigOrder) {
  auto p = Placer::Create({Host("h1"), Host("h2"), Host("h3")},
                          {{"rollout", Role(3, {"h2", "h3"})}});
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::vector<std::string> got;
  for (int i = 0; i < 4; ++i) {
    auto h = p->Pick("rollout", {});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    p->Add(*h, "rollout");
    got.push_back(*h);
  }
  EXPECT_EQ(got, (std::vector<std::string>{"h2", "h3", "h2", "h3"}));
  // Another role spreads over the hosts with the fewest actors in all.
  auto l = p->Pick("learner", {});
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(*l, "h1");
}

TEST(PlacerTest, PerNodeFillsAHostBeforeTheNext) {
  auto p = Placer::Create({Host("h1"), Host("h2")}, {{"rollout", Role(4, {}, 2)}});
  ASSERT_TRUE(p.ok());
  std::vector<std::string> got;
  for (int i = 0; i < 4; ++i) {
    auto h = p->Pick("rollout", {});
    ASSERT_TRUE(h.ok());
    p->Add(*h, "rollout");
    got.push_back(*h);
  }
  EXPECT_EQ(got, (std::vector<std::string>{"h1", "h1", "h2", "h2"}));
  auto full = p->Pick("rollout", {});
  ASSERT_FALSE(full.ok());
  EXPECT_NE(full.status().message().find("h1: has 2 rollout actors (per_node 2)"),
            std::string::npos)
      << full.status().message();
}

TEST(PlacerTest, ResourcesSlotsAndRefusals) {
  auto p = Placer::Create({Host("h1", 1), Host("h2", 8, {"gpu"}), Host("h3")},
                          {{"learner", Role(1, {}, 0, {"gpu"})}, {"rollout", Role(2)}});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(*p->Pick("learner", {}), "h2");
  auto none = p->Pick("learner", {"h2"});
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("h1: lacks gpu"), std::string::npos);
  EXPECT_NE(none.status().message().find("h2: failed just now"), std::string::npos);
  // h1 has one slot.
  p->Add("h1", "reward");
  EXPECT_EQ(*p->Pick("rollout", {}), "h2");
  // A host that refused is used only when nothing else is left.
  p->MarkDown("h2", "Permission denied (publickey)", 60000);
  EXPECT_EQ(*p->Pick("rollout", {}), "h3");
  p->Add("h3", "rollout");
  p->Add("h3", "rollout");
  EXPECT_EQ(*p->Pick("rollout", {}), "h3") << "h3 is up; h2 is down even with fewer actors";
  // An unconfirmed stop makes a host less attractive than an idle one.
  p->MarkUp("h2");
  p->AddPendingStop("h2", 1);
  EXPECT_EQ(*p->Pick("rollout", {}), "h3");
  p->AddPendingStop("h2", -1);
  EXPECT_EQ(*p->Pick("rollout", {}), "h2");
}

TEST(PlacerTest, ConfigErrorsNameTheProblem) {
  auto bad = Placer::Create({Host("h1")}, {{"rollout", Role(1, {"h7"})}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "rollout.hosts names 'h7', which is not in cluster.hosts");
  auto nogpu = Placer::Create({Host("h1")}, {{"learner", Role(1, {}, 0, {"gpu"})}});
  ASSERT_FALSE(nogpu.ok());
  EXPECT_NE(nogpu.status().message().find("[gpu] of learner.resources"), std::string::npos);
  auto twice = Placer::Create({Host("h1"), Host("h1")}, {});
  ASSERT_FALSE(twice.ok());
  EXPECT_NE(twice.status().message().find("listed twice"), std::string::npos);
  EXPECT_FALSE(Placer::Create({}, {}).ok());
}

TEST(RemoteScriptTest, QuotingSurvivesAShell) {
  for (std::string s : {"plain", "with space", "it's", "$HOME `x` \"q\"", "a\\b", ""}) {
    std::string out_file = ::testing::TempDir() + "quote." + std::to_string(::getpid());
    SpawnOptions o;
    o.argv = {"/bin/sh", "-c", "printf %s " + remote::ShellQuote(s)};
    o.output_file = out_file;
    ::unlink(out_file.c_str());
    auto p = Subprocess::Spawn(o);
    ASSERT_TRUE(p.ok());
    auto e = p->Wait(Deadline::InMs(10000));
    ASSERT_TRUE(e.ok());
    auto text = ReadFile(out_file);
    ASSERT_TRUE(text.ok());
    EXPECT_EQ(*text, s);
    ::unlink(out_file.c_str());
  }
}

TEST(RemoteScriptTest, LaunchScriptPrintsItsPidAndExecsTheActor) {
  ActorLaunch l;
  l.actor_id = "rollout-0";
  l.binary = "/bin/echo";
  l.args = {"--id", "rollout-0", "it's"};
  l.env = {{"TROUPE_X", "a b"}};
  std::string out_file = ::testing::TempDir() + "launch." + std::to_string(::getpid());
  ::unlink(out_file.c_str());
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", remote::LaunchScript(l, "10.0.0.5")};
  o.output_file = out_file;
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok());
  int pid = p->pid();
  ASSERT_TRUE(p->Wait(Deadline::InMs(10000)).ok());
  auto text = ReadFile(out_file);
  ASSERT_TRUE(text.ok());
  // The shell's pid is the actor's pid (exec) and its process group (Subprocess: setpgid).
  EXPECT_EQ(remote::FindRemotePid(*text), pid);
  EXPECT_NE(text->find("--id rollout-0 it's --bind-host 10.0.0.5\n"), std::string::npos) << *text;
  ::unlink(out_file.c_str());
}

TEST(RemoteScriptTest, SignalScriptOnlyHitsTheRightActor) {
  // A stand-in "actor": a shell (the group leader) whose command line carries the id and head.
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", "sleep 60; true", "--id", "rollout-3", "--head", "tcp://10.0.0.1:7"};
  auto p = Subprocess::Spawn(o);
  ASSERT_TRUE(p.ok());
  auto run = [&](const std::string& script) {
    SpawnOptions s;
    s.argv = {"/bin/sh", "-c", script};
    auto q = Subprocess::Spawn(s);
    EXPECT_TRUE(q.ok());
    auto e = q->Wait(Deadline::InMs(10000));
    EXPECT_TRUE(e.ok());
    return e.ok() && e->exited ? e->code : -1;
  };
  // Another head's actor with the same id, or another id: left alone (exit 3).
  EXPECT_EQ(run(remote::SignalScript(p->pid(), SIGTERM, "rollout-3", "tcp://10.0.0.1:8")), 3);
  EXPECT_EQ(run(remote::SignalScript(p->pid(), SIGTERM, "rollout-33", "tcp://10.0.0.1:7")), 3);
  EXPECT_TRUE(p->running());
  EXPECT_EQ(run(remote::SignalScript(p->pid(), SIGTERM, "rollout-3", "tcp://10.0.0.1:7")), 0);
  auto e = p->Wait(Deadline::InMs(10000));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->signal, SIGTERM);
  // Gone: exit 3.
  EXPECT_EQ(run(remote::SignalScript(p->pid(), SIGKILL, "rollout-3", "tcp://10.0.0.1:7")), 3);
}

TEST(RemoteScriptTest, MarkerAndErrorLines) {
  EXPECT_EQ(remote::FindRemotePid("Warning: x\ntroupe-remote-pid 4242\nactor line\n"), 4242);
  EXPECT_EQ(remote::FindRemotePid("xtroupe-remote-pid 4242\n"), std::nullopt);
  EXPECT_EQ(remote::FindRemotePid("troupe-remote-pid 12ab\n"), std::nullopt);
  EXPECT_EQ(remote::FindRemotePid(""), std::nullopt);
  EXPECT_EQ(remote::LastLines("a\n\nb\ntroupe-remote-pid 1\nc\nd\n", 3), "b; c; d");
  EXPECT_EQ(remote::LastLines("root@h9: Permission denied (publickey).\r\n"),
            "root@h9: Permission denied (publickey).");
  EXPECT_EQ(remote::ArgValue({"--role", "x", "--head", "tcp://a:1"}, "--head"), "tcp://a:1");
  EXPECT_EQ(remote::ArgValue({"--head"}, "--head"), "");
}

TEST(AdvertiseAddressTest, ReachableFromEveryHost) {
  ClusterSpec c;
  c.backend = "local";
  EXPECT_EQ(*ResolveAdvertiseAddress(c, {}), "127.0.0.1");
  c.bind_interface = "lo";
  EXPECT_EQ(*ResolveAdvertiseAddress(c, {}), "127.0.0.1");
  c.bind_interface = "no-such-if0";
  auto bad_if = ResolveAdvertiseAddress(c, {});
  ASSERT_FALSE(bad_if.ok());
  EXPECT_NE(bad_if.status().message().find("'no-such-if0' has no IPv4 address"),
            std::string::npos);
  // A remote host must not be told 127.0.0.1.
  c = ClusterSpec{};
  c.backend = "ssh";
  c.advertise_address = "127.0.0.1";
  HostSpec far;
  far.name = "far";
  far.address = "10.200.0.7";
  auto loop = ResolveAdvertiseAddress(c, {far});
  ASSERT_FALSE(loop.ok());
  EXPECT_NE(loop.status().message().find("which host far (10.200.0.7) cannot reach"),
            std::string::npos)
      << loop.status().message();
  c.advertise_address = "0.0.0.0";
  EXPECT_FALSE(ResolveAdvertiseAddress(c, {far}).ok());
  // ... but hosts that are this machine's loopback may be.
  HostSpec near;
  near.name = "near";
  near.address = "127.0.0.1";
  c.advertise_address = "";
  EXPECT_EQ(*ResolveAdvertiseAddress(c, {near}), "127.0.0.1");
  c.advertise_address = "10.9.8.7";
  EXPECT_EQ(*ResolveAdvertiseAddress(c, {far}), "10.9.8.7");
}

TEST(SlurmTest, NodesNeededFromRoles) {
  ClusterSpec c;
  std::map<std::string, RoleProcess> roles = {
      {"learner", Role(1)}, {"rollout", Role(5, {}, 2)}, {"reward", Role(0)}};
  EXPECT_EQ(SlurmNodesNeeded(c, roles), 4u);  // 1 + ceil(5/2); reward has no actors
  c.slurm_nodes = 7;
  EXPECT_EQ(SlurmNodesNeeded(c, roles), 7u);
  RemoteSpawnerOptions o;
  o.cluster.hosts = {Host("h1")};
  auto s = NewSlurmSpawner(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("inside an allocation"), std::string::npos);
}

}  // namespace
}  // namespace troupe::launcher
