// The delivery guarantee with real processes: a receiver child (this binary
// re-executed with --receiver) is SIGKILLed mid-stream and restarted on the
// same ipc endpoint. Nothing is lost (every message not acknowledged before
// the kill arrives after the restart), each lifetime sees every message at
// most once and in order, and messages acknowledged before the kill were
// processed by the first lifetime.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "test_util.h"
#include "troupe/core/log.h"
#include "troupe/transport/reliable.h"
#include "troupe/transport/zmq_network.h"

extern char** environ;

namespace troupe::transport {
namespace {

using testing::EchoText;
using testing::MakeEcho;
using testing::TempDir;

// ---------------------------------------------------------------- child

// Receives on `endpoint`; for each delivery appends "<incarnation> <id>\n" to
// `log_path` (one write(2), so a SIGKILL never leaves half a line) and then
// acks. Exits when the parent dies or after `idle_s` without messages.
int ReceiverMain(const std::string& endpoint, const std::string& log_path, int idle_s) {
  const pid_t parent = getppid();
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) return 3;
  log::Init("receiver-child");
  ZmqNetworkOptions o;
  o.identity.actor_id = "receiver";
  auto net = NewZmqNetwork(o);
  if (!net.ok()) return 4;
  SocketOptions so;
  so.linger_ms = 0;
  auto server = (*net)->Bind(SocketKind::kServer, endpoint, so);
  if (!server.ok()) {
    std::fprintf(stderr, "bind failed: %s\n", server.status().ToString().c_str());
    return 5;
  }
  const int fd = ::open(log_path.c_str(), O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return 6;
  {
    ReliableReceiver receiver(server->get());
    const uint64_t inc = (*net)->identity().incarnation;
    auto idle = Deadline::In(std::chrono::seconds(idle_s));
    while (!idle.expired()) {
      auto d = receiver.Recv(Deadline::InMs(200));
      if (!d.ok()) continue;
      idle = Deadline::In(std::chrono::seconds(idle_s));
      if (!d->sequenced()) continue;
      const std::string line = fmt::format("{:x} {}\n", inc, EchoText(d->message));
      if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) return 7;
      receiver.Ack(*d);
    }
  }
  ::close(fd);
  server->reset();
  return 0;
}

// ---------------------------------------------------------------- parent

class Child {
 public:
  Child(const std::string& endpoint, const std::string& log_path) {
    std::string self = "/proc/self/exe";
    std::vector<std::string> args = {self, "--receiver", endpoint, log_path, "60"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, self.c_str(), nullptr, nullptr, argv.data(), environ), 0);
  }
  ~Child() { Kill(); }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

struct Line {
  std::string incarnation;
  int id;
};

std::vector<Line> ReadLog(const std::string& path) {
  std::vector<Line> out;
  std::ifstream in(path);
  std::string inc;
  int id;
  while (in >> inc >> id) out.push_back({inc, id});
  return out;
}

void RunKillTest(size_t payload_ints, int total, int kill_after_acks) {
  TempDir dir;
  const std::string endpoint = dir.Ipc("receiver");
  const std::string log_path = dir.path() + "/deliveries.log";
  ZmqNetworkOptions o;
  o.identity.actor_id = "sender";
  auto net = NewZmqNetwork(o);
  ASSERT_TRUE(net.ok());

  ReliableSenderOptions so;
  so.retransmit_timeout_ms = 200;
  so.max_retransmit_timeout_ms = 1000;
  so.max_outbox_messages = 64;
  so.peer_socket.linger_ms = 0;
  std::mutex mu;
  std::condition_variable cv;
  std::set<int> acked;
  int rejected = 0;
  {
    ReliableSender sender(net->get(), so);
    sender.SetOutcomeCallback([&](const DeliveryOutcome& out) {
      std::lock_guard<std::mutex> g(mu);
      if (!out.accepted) ++rejected;
      acked.insert(std::stoi(out.message.reader().getBody().getEcho().getText().cStr()));
      cv.notify_all();
    });
    ASSERT_TRUE(sender.ConnectPeer("receiver", endpoint).ok());

    auto child = std::make_unique<Child>(endpoint, log_path);
    std::set<int> acked_before_kill;
    int next = 0;
    // First part of the stream, then SIGKILL once enough were acknowledged
    // while more are in flight.
    while (next < total) {
      ASSERT_TRUE(
          sender.Send(MakeEcho(std::to_string(next), payload_ints, next), Deadline::InMs(30000))
              .ok());
      ++next;
      std::lock_guard<std::mutex> g(mu);
      if (static_cast<int>(acked.size()) >= kill_after_acks) break;
    }
    {
      std::unique_lock<std::mutex> g(mu);
      ASSERT_TRUE(cv.wait_for(g, std::chrono::seconds(60),
                              [&] { return static_cast<int>(acked.size()) >= kill_after_acks; }));
    }
    // Keep a window in flight, then kill.
    for (int i = 0; i < 32 && next < total; ++i, ++next) {
      ASSERT_TRUE(
          sender.Send(MakeEcho(std::to_string(next), payload_ints, next), Deadline::InMs(30000))
              .ok());
    }
    {
      std::lock_guard<std::mutex> g(mu);
      acked_before_kill = acked;
    }
    std::fprintf(stderr, "killing receiver pid %d after %zu acks, %d sent\n", child->pid(),
                 acked_before_kill.size(), next);
    child->Kill();
    const size_t lines_first = ReadLog(log_path).size();
    // Sends continue while the receiver is down until the outbox is full:
    // then Send reports backpressure instead of dropping anything.
    int backpressure = 0;
    for (int i = 0; i < 16 && next < total; ++i) {
      Status st =
          sender.Send(MakeEcho(std::to_string(next), payload_ints, next), Deadline::InMs(20));
      if (st.code() == Code::kResourceExhausted) {
        ++backpressure;
        break;
      }
      ASSERT_TRUE(st.ok()) << st.ToString();
      ++next;
    }
    std::fprintf(stderr, "sent %d while the receiver was down (outbox full: %s)\n", next,
                 backpressure ? "yes" : "no");
    child = std::make_unique<Child>(endpoint, log_path);
    for (; next < total; ++next) {
      ASSERT_TRUE(
          sender.Send(MakeEcho(std::to_string(next), payload_ints, next), Deadline::InMs(30000))
              .ok());
    }
    Status flushed = sender.Flush(Deadline::InMs(90000));
    ASSERT_TRUE(flushed.ok()) << flushed.ToString();
    child->Kill();
    auto st = sender.stats();
    std::fprintf(
        stderr,
        "sent %llu acked %llu retransmits %llu receiver restarts seen %llu; first lifetime "
        "logged %zu\n",
        static_cast<unsigned long long>(st.sent), static_cast<unsigned long long>(st.acked),
        static_cast<unsigned long long>(st.retransmits),
        static_cast<unsigned long long>(st.receiver_restarts), lines_first);
    EXPECT_EQ(st.acked, static_cast<uint64_t>(total));
    EXPECT_EQ(rejected, 0);

    // Check the log written by both lifetimes.
    auto lines = ReadLog(log_path);
    std::map<std::string, std::vector<int>> by_life;
    std::vector<std::string> order;
    for (const auto& l : lines) {
      if (!by_life.count(l.incarnation)) order.push_back(l.incarnation);
      by_life[l.incarnation].push_back(l.id);
    }
    ASSERT_EQ(order.size(), 2u) << "expected two receiver lifetimes in the log";
    std::set<int> all;
    for (const auto& [inc, ids] : by_life) {
      for (size_t i = 1; i < ids.size(); ++i) {
        ASSERT_LT(ids[i - 1], ids[i])
            << "lifetime " << inc << ": duplicate or out of order at " << i;
      }
      all.insert(ids.begin(), ids.end());
    }
    EXPECT_EQ(all.size(), static_cast<size_t>(total)) << "messages lost";
    // Acknowledged before the kill => processed by the first lifetime.
    std::set<int> first(by_life[order[0]].begin(), by_life[order[0]].end());
    for (int id : acked_before_kill) EXPECT_TRUE(first.count(id)) << id;
    // Everything not acknowledged before the kill arrived after the restart.
    std::set<int> second(by_life[order[1]].begin(), by_life[order[1]].end());
    for (int id = 0; id < total; ++id) {
      if (!acked_before_kill.count(id) && !first.count(id)) {
        EXPECT_TRUE(second.count(id)) << "unacked message " << id << " never arrived";
      }
    }
  }
}

TEST(ReliableKill, SmallMessagesSurviveSigkillOfTheReceiver) {
  RunKillTest(0, 3000, 600);
}

TEST(ReliableKill, TensorBatchesSurviveSigkillOfTheReceiver) {
  // 64 KiB tensors: each rides as its own zero-copy frame.
  RunKillTest(16 * 1024, 400, 100);
}

}  // namespace
}  // namespace troupe::transport

int main(int argc, char** argv) {
  if (argc >= 5 && std::string(argv[1]) == "--receiver") {
    return troupe::transport::ReceiverMain(argv[2], argv[3], std::atoi(argv[4]));
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
