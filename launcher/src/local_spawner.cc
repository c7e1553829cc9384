#include <signal.h>
#include <unistd.h>

#include "troupe/core/text.h"
#include "troupe/launcher/spawner.h"

namespace troupe::launcher {

namespace {

class LocalProcess final : public ActorProcess {
 public:
  LocalProcess(Subprocess p, std::string node) : proc_(std::move(p)), node_(std::move(node)) {}
  ~LocalProcess() override {
    // Bounded: the actor got SIGTERM earlier if the head stopped it cleanly;
    // anything still alive is killed with its group.
    if (!proc_.Poll()) {
      proc_.Signal(SIGKILL).IgnoreError();
      proc_.Wait(Deadline::InMs(5000)).status().IgnoreError();
    }
  }
  const std::string& node() const override { return node_; }
  int pid() const override { return proc_.pid(); }
  std::optional<ExitInfo> Poll() override { return proc_.Poll(); }
  void Terminate() override { proc_.Signal(SIGTERM).IgnoreError(); }
  void Kill() override { proc_.Signal(SIGKILL).IgnoreError(); }

 private:
  Subprocess proc_;
  std::string node_;
};

class LocalSpawner final : public Spawner {
 public:
  Result<std::unique_ptr<ActorProcess>> Spawn(const ActorLaunch& l) override {
    SpawnOptions o;
    o.argv.push_back(l.binary);
    o.argv.insert(o.argv.end(), l.args.begin(), l.args.end());
    o.env = l.env;
    o.output_file = l.output_file;
    o.stdin_data = l.secrets;
    auto p = Subprocess::Spawn(o);
    if (!p.ok()) return p.status().WithContext("local spawn of " + l.actor_id);
    return std::unique_ptr<ActorProcess>(new LocalProcess(std::move(p).value(), HostName()));
  }
  std::string name() const override { return "local"; }
};

}  // namespace

std::unique_ptr<Spawner> NewLocalSpawner() {
  return std::make_unique<LocalSpawner>();
}

}  // namespace troupe::launcher
