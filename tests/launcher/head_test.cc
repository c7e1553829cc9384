// Integration tests of the head with real troupe-actor processes (echo role):
// registration, status, restart after SIGKILL, scale up/down, stop, logs -f,
// actors exiting by themselves when the head dies, and an actor back from a
// partition after its replacement started.
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <gtest/gtest.h>

#include "../common/eventually.h"

#include "troupe/core/log.h"
#include "troupe/launcher/control_client.h"
#include "troupe/launcher/head.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/subprocess.h"
#include "troupe/transport/zmq_network.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;

std::string BuildDir() {
  const char* b = std::getenv("TROUPE_BUILD_DIR");
  return b ? b : "build";
}

template <typename Pred>
bool Eventually(Pred pred, int timeout_ms = 20000) {
  return troupe::testing::Eventually(pred, timeout_ms, 50);
}

bool Alive(int pid) {
  return pid > 0 && ::kill(pid, 0) == 0;
}

class HeadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) /
            ("head_test." + std::to_string(::getpid()) + "." +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    auto run = CreateRunDir(root_.string(), "echo");
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    run_ = *run;
    std::ofstream(run_.config())
        << "name: echo\nhead: {heartbeat_interval_ms: 100, heartbeat_timeout_ms: 2000, "
           "head_grace_ms: 3000}\n";
  }
  void TearDown() override {
    if (head_) {
      head_->RequestStop();
      if (thread_.joinable()) thread_.join();
      head_.reset();
    }
    for (int pid : seen_pids_)
      EXPECT_FALSE(Alive(pid)) << "actor pid " << pid << " outlived the test";
    fs::remove_all(root_);
  }

  void StartHead(uint32_t echo_count, uint32_t max_restarts = 3,
                 std::unique_ptr<Spawner> spawner = nullptr) {
    HeadOptions o;
    o.job_name = "echo";
    o.run = run_;
    o.spec.heartbeat_interval_ms = 100;
    o.spec.heartbeat_timeout_ms = 2000;
    o.spec.head_grace_ms = head_grace_ms_;
    o.spec.stop_grace_ms = 5000;
    RoleProcess echo;
    echo.count = echo_count;
    echo.max_restarts = max_restarts;
    echo.restart_backoff_ms = 50;
    o.roles["echo"] = echo;
    o.completion_role = "";
    o.actor_binary = BuildDir() + "/actors/troupe-actor";
    o.actor_env = ActorEnvironment();  // as `troupe run` sets it
    transport::ZmqNetworkOptions no;
    no.identity.actor_id = "head";
    auto net = transport::NewZmqNetwork(no);
    ASSERT_TRUE(net.ok());
    auto head = Head::Create(o, std::move(net).value(),
                             spawner ? std::move(spawner) : NewLocalSpawner());
    ASSERT_TRUE(head.ok()) << head.status().ToString();
    head_ = std::move(head).value();
    ASSERT_TRUE(WriteHeadInfo(run_, HeadInfo{head_->endpoint(), ::getpid(), "echo"}).ok());
    thread_ = std::thread([this] { run_status_ = head_->Run(); });
  }

  ControlResult Status() {
    auto r = SendControl(run_, "status", Deadline::InMs(5000));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return {};
    for (auto& a : r->actors) seen_pids_.insert(a.pid);
    seen_pids_.erase(0);
    return *r;
  }
  int ReadyCount() {
    int n = 0;
    for (auto& a : Status().actors) n += a.state == "ready";
    return n;
  }

  uint32_t head_grace_ms_ = 3000;
  fs::path root_;
  RunDir run_;
  std::unique_ptr<Head> head_;
  std::thread thread_;
  troupe::Status run_status_;
  std::set<int> seen_pids_;
};

TEST_F(HeadTest, ActorsRegisterAndStatusListsThem) {
  StartHead(2);
  ASSERT_TRUE(Eventually([&] { return ReadyCount() == 2; }));
  auto st = Status();
  ASSERT_EQ(st.actors.size(), 2u);
  EXPECT_EQ(st.actors[0].id, "echo-0");
  EXPECT_EQ(st.actors[1].role, "echo");
  EXPECT_GT(st.actors[0].pid, 0);
  EXPECT_GT(st.actors[0].last_heartbeat_ns, 0);
  // Every actor's log lines reach the head and land in logs/<actor>.log.
  ASSERT_TRUE(Eventually([&] {
    auto t = ReadFile(run_.log_file("echo-1"));
    return t.ok() && t->find("[echo-1] actors: echo serving at") != std::string::npos;
  }));
}

// Every actor process runs with ActorEnvironment() (passive OpenMP waits), as `troupe run`
// sets it: the variables reach the process itself.
TEST_F(HeadTest, ActorsRunWithTheActorEnvironment) {
  ::unsetenv("OMP_WAIT_POLICY");  // not inherited from this test's own environment
  StartHead(1);
  ASSERT_TRUE(Eventually([&] { return ReadyCount() == 1; }));
  const int pid = Status().actors.at(0).pid;
  auto env_file = ReadFile("/proc/" + std::to_string(pid) + "/environ");
  ASSERT_TRUE(env_file.ok()) << env_file.status().ToString();
  std::string e = "\n" + *env_file;
  for (char& c : e) c = c == '\0' ? '\n' : c;
  EXPECT_NE(e.find("\nOMP_WAIT_POLICY=PASSIVE\n"), std::string::npos) << e;
}

TEST_F(HeadTest, KilledActorIsRestarted) {
  StartHead(1);
  ASSERT_TRUE(Eventually([&] { return ReadyCount() == 1; }));
  int pid = Status().actors[0].pid;
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  ASSERT_TRUE(Eventually([&] {
    auto a = Status().actors;
    return a.size() == 1 && a[0].restarts == 1 && a[0].state == "ready" && a[0].pid != pid;
  }));
}

TEST_F(HeadTest, GivesUpAfterMaxRestarts) {
  StartHead(1, /*max_restarts=*/1);
  for (int round = 0; round < 2; ++round) {
    ASSERT_TRUE(Eventually([&] { return ReadyCount() == 1; }));
    ASSERT_EQ(::kill(Status().actors[0].pid, SIGKILL), 0);
    ASSERT_TRUE(Eventually([&] { return ReadyCount() == 0; }));
  }
  ASSERT_TRUE(Eventually([&] {
    auto a = Status().actors;
    return a.size() == 1 && a[0].state == "failed";
  }));
}

// Stands in for a remote backend whose host is cut off: stopping the first
// process it started "succeeds" (like an ssh client that gave up) while the
// process itself keeps running, owned here, so it can come back after the
// head has replaced it.
struct CutOff {
  std::mutex mu;
  std::unique_ptr<ActorProcess> survivor;  // the first process, once the head let go of it
  // The survivor's exit (reaps it); nullopt while it runs or before it was let go.
  std::optional<ExitInfo> SurvivorExit() {
    std::lock_guard<std::mutex> l(mu);
    return survivor ? survivor->Poll() : std::nullopt;
  }
};

class CutOffSpawner : public Spawner {
 public:
  explicit CutOffSpawner(std::shared_ptr<CutOff> cut) : cut_(std::move(cut)) {}
  Result<std::unique_ptr<ActorProcess>> Spawn(const ActorLaunch& launch) override {
    TROUPE_ASSIGN_OR_RETURN(auto p, local_->Spawn(launch));
    if (spawned_++ > 0) return p;
    return std::unique_ptr<ActorProcess>(new Process(std::move(p), cut_));
  }
  std::string name() const override { return "cut-off"; }

 private:
  class Process : public ActorProcess {
   public:
    Process(std::unique_ptr<ActorProcess> inner, std::shared_ptr<CutOff> cut)
        : inner_(std::move(inner)), cut_(std::move(cut)), node_(inner_->node()),
          pid_(inner_->pid()) {}
    ~Process() override { LetGo(); }
    const std::string& node() const override { return node_; }
    int pid() const override { return pid_; }
    std::optional<ExitInfo> Poll() override {
      if (!inner_) return ExitInfo{false, 0, SIGKILL};
      return inner_->Poll();
    }
    void Terminate() override { LetGo(); }
    void Kill() override { LetGo(); }

   private:
    void LetGo() {
      if (!inner_) return;
      std::lock_guard<std::mutex> l(cut_->mu);
      cut_->survivor = std::move(inner_);
    }
    std::unique_ptr<ActorProcess> inner_;
    std::shared_ptr<CutOff> cut_;
    std::string node_;
    int pid_;
  };
  std::unique_ptr<Spawner> local_ = NewLocalSpawner();
  std::shared_ptr<CutOff> cut_;
  int spawned_ = 0;
};

// An actor frozen past the heartbeat timeout is declared lost and replaced;
// when the old incarnation comes back (its host could not be reached to kill
// it) it is told to shut down, and it never takes over its replacement's
// route: the replacement stays registered and heard from. Actors connect to
// the head as "<id>#<incarnation>"; with a plain "<id>" the old connection
// would take the route and the replacement would be declared lost.
TEST_F(HeadTest, IncarnationBackFromAPartitionIsShutDownAndReplacementKeepsItsRoute) {
  head_grace_ms_ = 20000;  // the frozen actor must not give up on the head by itself
  auto cut = std::make_shared<CutOff>();
  StartHead(1, 3, std::make_unique<CutOffSpawner>(cut));
  ASSERT_TRUE(Eventually([&] { return ReadyCount() == 1; }));
  const int old_pid = Status().actors[0].pid;
  ASSERT_EQ(::kill(old_pid, SIGSTOP), 0);
  int new_pid = 0;
  ASSERT_TRUE(Eventually([&] {
    auto a = Status().actors;
    if (a.size() == 1 && a[0].state == "ready" && a[0].pid != old_pid) new_pid = a[0].pid;
    return new_pid > 0;
  }));
  ASSERT_EQ(::kill(old_pid, SIGCONT), 0);
  // The old incarnation hears "shut down" and exits by itself (nobody kills it).
  std::optional<ExitInfo> old_exit;
  EXPECT_TRUE(Eventually([&] { return (old_exit = cut->SurvivorExit()).has_value(); }, 10000));
  if (old_exit) {
    EXPECT_TRUE(old_exit->exited) << old_exit->ToString();
  }
  // The replacement keeps its route: still ready, same process, no further
  // restart, for longer than the heartbeat timeout.
  auto until = Deadline::InMs(3000);
  while (!until.expired()) {
    auto a = Status().actors;
    ASSERT_EQ(a.size(), 1u);
    EXPECT_EQ(a[0].pid, new_pid);
    EXPECT_EQ(a[0].restarts, 1);
    EXPECT_EQ(a[0].state, "ready");
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  {
    std::lock_guard<std::mutex> l(cut->mu);
    if (cut->survivor) cut->survivor->Kill();
  }
}

TEST_F(HeadTest, ScaleUpAndDownDrainsNewestFirst) {
  StartHead(1);
  ASSERT_TRUE(Eventually([&] { return ReadyCount() == 1; }));
  auto up = SendControl(run_, "scale", Deadline::InMs(5000), "echo", 3);
  ASSERT_TRUE(up.ok()) << up.status().ToString();
  ASSERT_TRUE(Eventually([&] { return ReadyCount() == 3; }));
  auto down = SendControl(run_, "scale", Deadline::InMs(5000), "echo", 1);
  ASSERT_TRUE(down.ok());
  ASSERT_TRUE(Eventually([&] {
    auto a = Status().actors;
    return a.size() == 1 && a[0].id == "echo-0" && a[0].state == "ready";
  }));
  auto bad = SendControl(run_, "scale", Deadline::InMs(5000), "learner", 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("only rollout and reward"), std::string::npos);
}

TEST_F(HeadTest, StopEndsEveryActor) {
  StartHead(2);
  ASSERT_TRUE(Eventually([&] { return ReadyCount() == 2; }));
  auto pids = seen_pids_;
  auto r = SendControl(run_, "stop", Deadline::InMs(5000));
  ASSERT_TRUE(r.ok());
  thread_.join();
  EXPECT_TRUE(run_status_.ok()) << run_status_.ToString();
  for (int pid : pids) EXPECT_TRUE(Eventually([&] { return !Alive(pid); }, 5000));
  EXPECT_TRUE(head_->summary().stopped);
}

TEST_F(HeadTest, UnknownRunAndDeadHeadAreClearErrors) {
  auto missing = ResolveRunDir(root_.string(), "no-such-run");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("unknown run 'no-such-run'"), std::string::npos);
  // head.json pointing at a port nobody serves.
  ASSERT_TRUE(WriteHeadInfo(run_, HeadInfo{"tcp://127.0.0.1:1", 0, "x"}).ok());
  auto r = SendControl(run_, "status", Deadline::InMs(1500));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no answer from the head"), std::string::npos)
      << r.status().message();
}

// The head dies after an actor sent Register but before it acknowledged
// (here: a "head" socket that never answers). The actor's head-silence rule
// covers registration too: it exits with code 3 (head lost) after
// head_grace_ms, not after register_timeout_ms with a registration error.
TEST(ActorRuntime, ActorWhoseHeadNeverAnswersRegisterExitsAsHeadLost) {
  fs::path dir = fs::path(::testing::TempDir()) / ("silent_head." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.yaml")
      << "name: silent\nlearner: {count: 0}\nrollout: {count: 0}\nreward: {count: 0}\n"
      << "echo: {count: 1}\nhead: {head_grace_ms: 1000, register_timeout_ms: 120000}\n";
  transport::ZmqNetworkOptions no;
  no.identity.actor_id = "head";
  auto net = transport::NewZmqNetwork(no);
  ASSERT_TRUE(net.ok());
  auto head = (*net)->Bind(transport::SocketKind::kServer, "tcp://127.0.0.1:0");
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  SpawnOptions so;
  so.argv = {BuildDir() + "/actors/troupe-actor", "--role", "echo", "--id", "echo-0",
             "--head", (*head)->endpoint(), "--run-dir", dir.string()};
  so.output_file = (dir / "actor.out").string();
  auto actor = Subprocess::Spawn(so);
  ASSERT_TRUE(actor.ok()) << actor.status().ToString();
  // The Register arrives (and is never answered).
  bool got_register = false;
  auto until = Deadline::InMs(30000);
  while (!got_register && !until.expired()) {
    auto in = (*head)->Recv(Deadline::InMs(200));
    got_register = in.ok() && in->message.kind() == transport::MessageKind::REGISTER;
  }
  EXPECT_TRUE(got_register);
  // Well before register_timeout_ms (120 s) the actor must be gone, as head lost.
  auto e = actor->Wait(Deadline::InMs(60000));
  ASSERT_TRUE(e.ok()) << "the actor outlived a silent head: " << e.status().ToString();
  EXPECT_TRUE(e->exited && e->code == 3) << e->ToString();
  auto out = ReadFile((dir / "actor.out").string());
  ASSERT_TRUE(out.ok());
  EXPECT_NE(out->find("the head has been silent"), std::string::npos) << *out;
  fs::remove_all(dir);
}

// The CLI end to end: `troupe run` in the background, `logs -f` follows new
// lines, and SIGKILL of the head makes every actor exit within the grace period
// — echo-1 too, whose role never returns (echo.stuck_actor): the runtime's
// backstop ends it (DESIGN invariant 6, "no orphans").
TEST(TroupeCli, LogsFollowAndActorsOutliveNoDeadHead) {
  fs::path dir = fs::path(::testing::TempDir()) / ("cli_test." + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream cfg(dir / "echo.yaml");
    cfg << "name: cli\nlearner: {count: 0}\nrollout: {count: 0}\nreward: {count: 0}\n"
        << "echo: {count: 1, stuck_actor: echo-1}\n"
        << "head: {heartbeat_interval_ms: 100, heartbeat_timeout_ms: 1000, head_grace_ms: 1500}\n";
  }
  std::string troupe = BuildDir() + "/launcher/troupe";
  std::string runs = (dir / "runs").string();
  SpawnOptions so;
  so.argv = {troupe, "--runs-dir", runs, "run", (dir / "echo.yaml").string()};
  so.output_file = (dir / "head.out").string();
  auto head = Subprocess::Spawn(so);
  ASSERT_TRUE(head.ok()) << head.status().ToString();
  // Wait for the run folder and the actor.
  Result<RunDir> run = NotFound("not yet");
  ASSERT_TRUE(Eventually([&] {
    run = ResolveRunDir(runs, "");
    if (!run.ok() || !fs::exists(run->head_file())) return false;
    auto st = SendControl(*run, "status", Deadline::InMs(1000));
    return st.ok() && st->actors.size() == 1 && st->actors[0].state == "ready";
  }));
  SpawnOptions lo;
  lo.argv = {troupe, "--runs-dir", runs, "logs", "--all", "-f"};
  lo.output_file = (dir / "follow.out").string();
  auto follow = Subprocess::Spawn(lo);
  ASSERT_TRUE(follow.ok());
  // A new actor writes new lines; the follower must show them.
  SpawnOptions sc;
  sc.argv = {troupe, "--runs-dir", runs, "scale", "echo=2"};
  auto scale = Subprocess::Spawn(sc);
  ASSERT_TRUE(scale.ok());
  auto scale_exit = scale->Wait(Deadline::InMs(10000));
  ASSERT_TRUE(scale_exit.ok() && scale_exit->exited && scale_exit->code == 0);
  ASSERT_TRUE(Eventually([&] {
    auto t = ReadFile(dir / "follow.out");
    return t.ok() && t->find("[echo-1] actors: echo serving") != std::string::npos;
  }));
  follow->Stop();
  auto st = SendControl(*run, "status", Deadline::InMs(2000));
  ASSERT_TRUE(st.ok());
  std::vector<int> pids;
  for (auto& a : st->actors) pids.push_back(a.pid);
  ASSERT_EQ(pids.size(), 2u);
  // Kill only the head process; the actors are in their own process groups.
  ASSERT_EQ(::kill(head->pid(), SIGKILL), 0);
  ASSERT_TRUE(head->Wait(Deadline::InMs(5000)).ok());
  for (int pid : pids) {
    EXPECT_TRUE(Eventually([&] { return !Alive(pid); }, 30000))
        << "actor " << pid << " outlived its head";
    if (Alive(pid)) ::kill(pid, SIGKILL);
  }
  // Logs reach the head's files through the head; with it gone, stderr (.out) has them.
  auto stuck = ReadFile(run->logs() + "/echo-1.out");
  ASSERT_TRUE(stuck.ok()) << stuck.status().ToString();
  EXPECT_NE(stuck->find("after losing the head: ending the process now"), std::string::npos)
      << *stuck;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::launcher
