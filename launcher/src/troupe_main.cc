// troupe: the command-line front door.
//
//   troupe run CONFIG [--set key=value ...] [--detach]    launch a job (hosts its head)
//   troupe run CONFIG --submit                            submit it to Slurm with sbatch
//   troupe run --resume RUN                               continue from the last checkpoint
//   troupe status [RUN]                                   actors table
//   troupe logs [RUN] ACTOR [-f] | --all [-f]             one actor's log / all, interleaved
//   troupe dashboard [RUN] [--bind ADDR[:PORT]]           serve a run's dashboard from its folder
//   troupe scale [RUN] rollout=N [reward=M]               grow or shrink a role while it runs
//   troupe stop [RUN]                                     graceful stop (learner checkpoints)
//   troupe config-keys                                    every config key with its doc
//   troupe tokenize DIR [--decode]                        a model folder's tokenizer on stdin
//   troupe chat-template DIR CONVERSATION.json [--ids]    a model folder's chat template
//   troupe export [RUN] [--checkpoint N] --to DIR         a checkpoint as a Hugging Face folder
// RUN defaults to the latest run (runs/latest). Errors are one line and exit 1
// (2 for bad arguments or config).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "chat_template_cmd.h"
#include "export_cmd.h"
#include "remote_spawner.h"
#include "tokenize_cmd.h"
#include "troupe/core/log.h"
#include "troupe/core/random.h"
#include "troupe/core/text.h"
#include "troupe/launcher/control_client.h"
#include "troupe/launcher/dashboard.h"
#include "troupe/launcher/head.h"
#include "troupe/launcher/job_config.h"
#include "troupe/launcher/run_dir.h"
#include "troupe/launcher/spawner.h"
#include "troupe/launcher/subprocess.h"
#include "troupe/transport/curve.h"
#include "troupe/transport/zmq_network.h"

using namespace troupe;
using namespace troupe::launcher;
namespace fs = std::filesystem;

namespace {

int Fail(const std::string& msg, int code = 1) {
  std::cerr << "troupe: " << msg << "\n";
  return code;
}

std::string FindActorBinary(const ClusterSpec& c) {
  if (!c.actor_binary.empty()) return c.actor_binary;
  std::string self = SelfDir();
  for (const std::string& cand : {self + "/troupe-actor", self + "/../actors/troupe-actor"}) {
    if (::access(cand.c_str(), X_OK) == 0) return fs::weakly_canonical(cand).string();
  }
  return FindExecutable("troupe-actor");
}

// ---------------------------------------------------------------- run

struct RunArgs {
  std::string config;
  std::vector<std::string> sets;
  bool detach = false;
  bool submit = false;
  std::string resume;
  std::string runs_dir;
  std::string log_level = "info";
  std::string dashboard_bind;  // --dashboard-bind ADDR[:PORT]
};

std::atomic<Head*> g_head{nullptr};

void StopSignalThread(sigset_t set) {
  int sig = 0;
  while (sigwait(&set, &sig) == 0) {
    if (sig == SIGUSR2) return;
    if (auto* h = g_head.load()) h->RequestStop();
  }
}

// What actors read on stdin (JSON): the CURVE keys when CURVE is on, the job's
// endpoint token when it has agent servers (every rollout actor's generation
// endpoint accepts this one bearer token and no other; also written to
// RUN/secrets/endpoint.json for manual calls) and, for remote backends, the
// resolved config (hosts need not share the run folder). "" when there is nothing.
Result<std::string> MakeSecrets(const JobConfig& job, const RunDir& run,
                                transport::CurveOptions* head_curve) {
  bool multi_host = job.cluster.backend != "local";
  bool on = job.cluster.curve == "on" || (job.cluster.curve == "auto" && multi_host);
  nlohmann::json j = nlohmann::json::object();
  if (multi_host) {
    TROUPE_ASSIGN_OR_RETURN(std::string config_text, ReadFile(run.config()));
    j["config_yaml"] = config_text;
  }
  if (job.agents.enabled()) {
    TROUPE_ASSIGN_OR_RETURN(std::string token, RandomHex(32));
    TROUPE_RETURN_IF_ERROR(WriteFileAtomic(run.secrets() + "/endpoint.json",
                                           nlohmann::json{{"token", token}}.dump() + "\n", 0600));
    j["endpoint_token"] = token;
  }
  if (on) {
    TROUPE_ASSIGN_OR_RETURN(auto server, transport::GenerateCurveKeyPair());
    TROUPE_ASSIGN_OR_RETURN(auto client, transport::GenerateCurveKeyPair());
    nlohmann::json c;
    c["curve"] = true;
    c["server_public"] = server.public_key;
    c["server_secret"] = server.secret_key;
    c["client_public"] = client.public_key;
    c["client_secret"] = client.secret_key;
    c["allowed_clients"] = std::vector<std::string>{client.public_key};
    TROUPE_RETURN_IF_ERROR(WriteFileAtomic(run.secrets() + "/curve.json", c.dump() + "\n", 0600));
    head_curve->enabled = true;
    head_curve->server = server;
    head_curve->client = client;
    head_curve->allowed_client_public_keys = {client.public_key};
    j.update(c);
  }
  return j.empty() ? std::string() : j.dump();
}

// The roles the head supervises (roles without actors that cannot be scaled are left out).
std::map<std::string, RoleProcess> JobRoles(const JobConfig& job) {
  std::map<std::string, RoleProcess> roles;
  roles["learner"] = job.learner;
  roles["rollout"] = job.rollout;
  roles["reward"] = job.reward;
  if (job.echo.count > 0) roles["echo"] = job.echo;
  for (auto it = roles.begin(); it != roles.end();) {
    if (it->second.count == 0 && it->first != "rollout" && it->first != "reward")
      it = roles.erase(it);
    else
      ++it;
  }
  return roles;
}

// The hosts a remote backend places actors on (slurm: the allocation's nodes).
Result<std::vector<HostSpec>> BackendHosts(const JobConfig& job, std::string* slurm_job) {
  if (job.cluster.backend != "slurm") return job.cluster.hosts;
  const char* id = std::getenv("SLURM_JOB_ID");
  const char* nodes = std::getenv("SLURM_JOB_NODELIST");
  if (!id || !*id)
    return InvalidArgument(
        "cluster.backend is slurm but this is not a Slurm allocation (no "
        "SLURM_JOB_ID): start `troupe run` under salloc or sbatch, or add "
        "--submit to submit the job with sbatch");
  *slurm_job = id;
  return SlurmAllocationHosts(job.cluster, nodes ? nodes : "", Deadline::InMs(30000));
}

// `troupe run CONFIG --submit`: the whole job (its head included) becomes one sbatch job.
int CmdSubmit(const JobConfig& job, const RunArgs& a) {
  if (job.cluster.backend != "slurm")
    return Fail("--submit needs cluster.backend: slurm (this job's backend is '" +
                    job.cluster.backend + "')",
                2);
  std::error_code ec;
  std::string runs = fs::absolute(job.runs_dir, ec).lexically_normal().string();
  fs::create_directories(runs + "/submitted", ec);
  if (ec) return Fail("cannot create " + runs + "/submitted: " + ec.message());
  char stamp[32];
  std::time_t t = std::time(nullptr);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", std::localtime(&t));
  std::string base = runs + "/submitted/" + job.name + "-" + stamp;
  Status w = WriteFileAtomic(base + ".yaml", ResolvedConfigYaml(job));
  if (!w.ok()) return Fail(w.message());
  std::string self = fs::read_symlink("/proc/self/exe", ec).string();
  if (ec) return Fail("cannot find the troupe binary: " + ec.message());
  std::string script = "#!/bin/sh\n# Written by `troupe run --submit`: the head of job '" +
                       job.name + "' runs here, inside the allocation.\nexec " +
                       remote::ShellQuote(self) + " --runs-dir " + remote::ShellQuote(runs) +
                       " run " + remote::ShellQuote(base + ".yaml") + " --log-level " +
                       remote::ShellQuote(a.log_level) + "\n";
  w = WriteFileAtomic(base + ".sbatch", script, 0755);
  if (!w.ok()) return Fail(w.message());
  uint32_t nodes = SlurmNodesNeeded(job.cluster, JobRoles(job));
  std::vector<std::string> argv = {"sbatch", "--parsable", "--job-name=troupe-" + job.name,
                                   "--nodes=" + std::to_string(nodes),
                                   "--output=" + base + "-%j.out"};
  if (!job.cluster.slurm_partition.empty())
    argv.push_back("--partition=" + job.cluster.slurm_partition);
  argv.insert(argv.end(), job.cluster.sbatch_options.begin(), job.cluster.sbatch_options.end());
  argv.push_back(base + ".sbatch");
  auto out = remote::RunCapture(argv, {}, Deadline::InMs(60000));
  if (!out.ok()) return Fail("sbatch: " + out.status().message());
  std::string id = *out;
  while (!id.empty() && std::isspace(static_cast<unsigned char>(id.back()))) id.pop_back();
  id = id.substr(id.find_last_of('\n') == std::string::npos ? 0 : id.find_last_of('\n') + 1);
  id = id.substr(0, id.find(';'));
  std::cout << "submitted " << job.name << " to Slurm as job " << id << " (" << nodes
            << (nodes == 1 ? " node" : " nodes") << ")\n  output: " << base << "-" << id
            << ".out\n  once it runs: troupe --runs-dir " << runs << " status\n";
  return 0;
}

int CmdRun(RunArgs a) {
  Result<JobConfig> job = InvalidArgument("no config");
  RunDir run;
  if (!a.resume.empty()) {
    auto r = ResolveRunDir(a.runs_dir.empty() ? "runs" : a.runs_dir,
                           a.resume == "latest" ? "" : a.resume);
    if (!r.ok()) return Fail(r.status().message(), 2);
    run = *r;
    job = LoadResolvedConfig(run.config());
    if (job.ok() && !a.sets.empty()) return Fail("--set cannot change a resumed run's config", 2);
  } else {
    if (a.config.empty()) return Fail("run needs a CONFIG file (or --resume RUN)", 2);
    job = LoadJobConfig(a.config, a.sets);
  }
  if (!job.ok()) return Fail(job.status().message(), 2);
  if (!a.runs_dir.empty()) job->runs_dir = a.runs_dir;
  if (!a.dashboard_bind.empty()) {
    Status b = ParseDashboardBind(a.dashboard_bind, &job->dashboard.bind, &job->dashboard.port);
    if (!b.ok()) return Fail(b.message(), 2);
    job->dashboard.enabled = true;
  }
  if (!job->warm_start.init_from.empty() && a.resume.empty()) {
    // The learner reads it from its own working directory: pin it to ours.
    std::error_code ec;
    job->warm_start.init_from =
        fs::absolute(job->warm_start.init_from, ec).lexically_normal().string();
    if (job->cluster.backend == "local" && !fs::exists(job->warm_start.init_from, ec))
      return Fail("warm_start.init_from: '" + job->warm_start.init_from + "' does not exist", 2);
  }
  if (a.submit) {
    if (!a.resume.empty()) return Fail("--submit cannot be combined with --resume", 2);
    return CmdSubmit(*job, a);
  }
  // Where actors go and the address they reach the head at: settled before anything is created.
  std::string slurm_job;
  auto hosts = BackendHosts(*job, &slurm_job);
  if (!hosts.ok()) return Fail(hosts.status().message(), 2);
  auto advertise = ResolveAdvertiseAddress(job->cluster, *hosts);
  if (!advertise.ok()) return Fail(advertise.status().message(), 2);
  std::unique_ptr<Spawner> spawner;
  if (job->cluster.backend == "local") {
    spawner = NewLocalSpawner();
  } else {
    RemoteSpawnerOptions so;
    so.cluster = job->cluster;
    so.cluster.hosts = *hosts;
    so.roles = JobRoles(*job);
    // An unreachable host's actors exit by themselves after head_grace_ms: retry stops that long.
    so.remote_kill_ms = std::max<uint32_t>(so.remote_kill_ms, job->head.head_grace_ms + 5000);
    so.slurm_job_id = slurm_job;
    auto sp = job->cluster.backend == "ssh" ? NewSshSpawner(so) : NewSlurmSpawner(so);
    if (!sp.ok()) return Fail(sp.status().message(), 2);
    spawner = std::move(sp).value();
  }
  if (a.resume.empty()) {
    auto r = CreateRunDir(job->runs_dir, job->name);
    if (!r.ok()) return Fail(r.status().message());
    run = *r;
    Status w = WriteFileAtomic(run.config(), ResolvedConfigYaml(*job));
    if (!w.ok()) return Fail(w.message());
  }
  std::string actor_binary = FindActorBinary(job->cluster);
  if (actor_binary.empty()) return Fail("cannot find troupe-actor (set cluster.actor_binary)", 2);

  if (a.detach) {
    pid_t pid = ::fork();
    if (pid < 0) return Fail("fork failed");
    if (pid > 0) {
      std::cout << "started " << job->name << " in " << run.path << " (head pid " << pid << ")\n"
                << "  troupe status " << run.name() << "   troupe logs " << run.name()
                << " --all -f\n";
      return 0;
    }
    ::setsid();
    std::string out = run.logs() + "/head.out";
    FILE* f = std::freopen(out.c_str(), "a", stdout);
    (void)f;
    f = std::freopen(out.c_str(), "a", stderr);
    (void)f;
    f = std::freopen("/dev/null", "r", stdin);
    (void)f;
  }

  // Stop signals go to one thread that asks the head to stop (twice: kill).
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread sig_thread(StopSignalThread, set);
  struct Joiner {
    std::thread& t;
    ~Joiner() {
      pthread_kill(t.native_handle(), SIGUSR2);
      t.join();
    }
  } joiner{sig_thread};

  log::Options lo;
  log::ParseLevel(a.log_level, &lo.level);
  lo.file = run.logs() + "/head.log";
  lo.to_stderr = false;
  log::Init("head", lo);
  auto warn_sink_guard = [] {};
  (void)warn_sink_guard;

  transport::ZmqNetworkOptions no;
  no.identity.actor_id = "head";
  auto secrets = MakeSecrets(*job, run, &no.curve);
  if (!secrets.ok()) return Fail(secrets.status().message());
  auto net = transport::NewZmqNetwork(no);
  if (!net.ok()) return Fail(net.status().message());

  HeadOptions ho;
  ho.job_name = job->name;
  ho.run = run;
  ho.spec = job->head;
  ho.roles = JobRoles(*job);
  if (!ho.roles.count("learner")) ho.completion_role = "";
  ho.bind_endpoint = "tcp://" + *advertise + ":0";
  ho.actor_binary = actor_binary;
  ho.actor_args = {"--config", run.config()};
  if (!secrets->empty()) {
    ho.actor_args.push_back("--secrets-stdin");
    ho.actor_secrets = *secrets;
  }
  ho.actor_env = ActorEnvironment();
  if (!a.resume.empty()) ho.actor_env["TROUPE_RESUME"] = "1";
  ho.live_progress = !a.detach && ::isatty(STDOUT_FILENO);
  TelemetryOptions tele;
  tele.job_name = job->name;
  tele.dashboard = job->dashboard;
  tele.tensorboard = job->tensorboard;
  if (job->dashboard.enabled && !IsLoopbackAddress(job->dashboard.bind)) {
    // Anything beyond this machine sees the job only with the token.
    auto token = NewDashboardToken();
    if (!token.ok()) return Fail(token.status().message());
    tele.dashboard_token = *token;
  }
  ho.telemetry = tele;
  ho.print = [](const std::string& line) {
    std::cout << line
              << (line.rfind('\r', 0) == 0 && line.find("\033[K") == std::string::npos ? "" : "\n")
              << std::flush;
  };
  auto head = Head::Create(ho, std::move(net).value(), std::move(spawner));
  if (!head.ok()) return Fail(head.status().message());
  const std::string dashboard = (*head)->dashboard_url();
  const std::string dashboard_public = dashboard.substr(0, dashboard.find("?token="));
  if (!tele.dashboard_token.empty()) {
    nlohmann::json d = {{"url", dashboard}, {"token", tele.dashboard_token}};
    Status t = WriteFileAtomic(run.secrets() + "/dashboard.json", d.dump(2) + "\n", 0600);
    if (!t.ok()) return Fail(t.message());
  }
  HeadInfo info{(*head)->endpoint(), ::getpid(), job->name};
  info.dashboard = dashboard_public;
  Status w = WriteHeadInfo(run, info);
  if (!w.ok()) return Fail(w.message());
  std::cout << "troupe: " << job->name << " -> " << run.path << "  (head " << (*head)->endpoint()
            << ")\n";
  if (!dashboard.empty()) std::cout << "troupe: dashboard " << dashboard << "\n";
  std::cout << std::flush;
  g_head = head->get();
  Status s = (*head)->Run();
  g_head = nullptr;
  auto sum = (*head)->summary();
  head->reset();
  log::Flush();
  if (!s.ok()) return Fail("job failed: " + s.message());
  std::cout << (sum.completed ? "job complete"
                : sum.stopped ? "job stopped"
                              : "job ended")
            << ": " << run.path << "\n";
  return 0;
}

// ---------------------------------------------------------------- logs

int CmdLogs(const std::string& runs_dir, std::vector<std::string> pos, bool all, bool follow) {
  std::string run_arg;
  std::string actor;
  if (all) {
    if (pos.size() > 1) return Fail("logs --all takes at most a RUN argument", 2);
    if (!pos.empty()) run_arg = pos[0];
  } else {
    if (pos.empty()) return Fail("logs needs an ACTOR (or --all)", 2);
    if (pos.size() > 2) return Fail("logs takes [RUN] ACTOR", 2);
    actor = pos.back();
    if (pos.size() == 2) run_arg = pos[0];
  }
  auto run = ResolveRunDir(runs_dir, run_arg);
  if (!run.ok()) return Fail(run.status().message(), 2);  // an unknown RUN argument
  struct Tail {
    std::string name, path;
    std::streamoff pos = 0;
    std::string partial;
  };
  std::vector<Tail> tails;
  auto refresh = [&] {
    std::error_code ec;
    for (auto& e : fs::directory_iterator(run->logs(), ec)) {
      if (e.path().extension() != ".log") continue;
      std::string name = e.path().stem().string();
      if (!all && name != actor) continue;
      bool known = false;
      for (auto& t : tails) known |= t.path == e.path().string();
      if (!known) tails.push_back({name, e.path().string()});
    }
  };
  refresh();
  if (!all && tails.empty() && !follow) {
    std::string known;
    std::error_code ec;
    for (auto& e : fs::directory_iterator(run->logs(), ec))
      if (e.path().extension() == ".log") known += " " + e.path().stem().string();
    return Fail("no log for actor '" + actor + "' in " + run->path +
                (known.empty() ? "" : " (actors:" + known + ")"));
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  while (true) {
    bool any = false;
    for (auto& t : tails) {
      std::ifstream in(t.path, std::ios::binary);
      if (!in) continue;
      in.seekg(0, std::ios::end);
      std::streamoff size = in.tellg();
      if (size < t.pos) t.pos = 0;  // truncated
      if (size == t.pos) continue;
      in.seekg(t.pos);
      std::string chunk(static_cast<size_t>(size - t.pos), '\0');
      in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
      t.pos = size;
      t.partial += chunk;
      size_t nl;
      while ((nl = t.partial.find('\n')) != std::string::npos) {
        std::cout << t.partial.substr(0, nl + 1);
        t.partial.erase(0, nl + 1);
        any = true;
      }
    }
    std::cout.flush();
    if (!std::cout) return 0;  // reader went away
    if (!follow) break;
    if (!any) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(100));  // polling a file: no event to wait on
      refresh();
    }
  }
  return 0;
}

// ---------------------------------------------------------------- status / scale / stop

int CmdStatus(const std::string& runs_dir, std::vector<std::string> pos, bool stats) {
  if (pos.size() > 1) return Fail("status takes at most a RUN argument", 2);
  auto run = ResolveRunDir(runs_dir, pos.empty() ? "" : pos[0]);
  if (!run.ok()) return Fail(run.status().message(), 2);  // an unknown RUN argument
  auto r = SendControl(*run, "status", Deadline::InMs(5000));
  if (!r.ok()) return Fail(r.status().message());
  std::cout << "run " << run->path << "\n";
  if (auto info = ReadHeadInfo(*run); info.ok() && !info->dashboard.empty())
    std::cout << "dashboard " << info->dashboard << "\n";
  std::cout << FormatStatusTable(*r, stats);
  return 0;
}

int CmdScale(const std::string& runs_dir, std::vector<std::string> pos) {
  std::vector<std::pair<std::string, uint32_t>> specs;
  std::string run_arg;
  for (const auto& p : pos) {
    auto eq = p.find('=');
    if (eq == std::string::npos) {
      if (!run_arg.empty() || !specs.empty())
        return Fail("bad scale spec '" + p + "': expected ROLE=COUNT", 2);
      run_arg = p;
      continue;
    }
    std::string role = p.substr(0, eq), num = p.substr(eq + 1);
    char* end = nullptr;
    long n = std::strtol(num.c_str(), &end, 10);
    if (num.empty() || *end != '\0' || n < 0 || n > 10000) {
      return Fail("bad scale spec '" + p + "': COUNT must be an integer in 0..10000", 2);
    }
    if (role != "rollout" && role != "reward" && role != "echo") {
      return Fail("bad scale spec '" + p + "': only rollout and reward can be scaled", 2);
    }
    specs.emplace_back(role, static_cast<uint32_t>(n));
  }
  if (specs.empty()) return Fail("scale needs ROLE=COUNT (e.g. rollout=4)", 2);
  auto run = ResolveRunDir(runs_dir, run_arg);
  if (!run.ok()) return Fail(run.status().message(), 2);  // an unknown RUN argument
  for (auto& [role, n] : specs) {
    auto r = SendControl(*run, "scale", Deadline::InMs(5000), role, n);
    if (!r.ok()) return Fail(r.status().message());
    std::cout << r->message << "\n";
  }
  return 0;
}

int CmdStop(const std::string& runs_dir, std::vector<std::string> pos, int wait_s) {
  if (pos.size() > 1) return Fail("stop takes at most a RUN argument", 2);
  auto run = ResolveRunDir(runs_dir, pos.empty() ? "" : pos[0]);
  if (!run.ok()) return Fail(run.status().message(), 2);  // an unknown RUN argument
  auto info = ReadHeadInfo(*run);
  auto r = SendControl(*run, "stop", Deadline::InMs(5000));
  if (!r.ok()) return Fail(r.status().message());
  std::cout << r->message << "\n";
  if (wait_s <= 0 || !info.ok() || info->pid <= 0) return 0;
  if (!info->host.empty() && info->host != HostName()) {
    std::cout << "the head runs on " << info->host << ": not waiting for it here\n";
    return 0;
  }
  auto deadline = Deadline::In(std::chrono::seconds(wait_s));
  while (!deadline.expired()) {
    if (::kill(info->pid, 0) != 0) {
      std::cout << "stopped\n";
      return 0;
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(100));  // another process: nothing to wait on
  }
  return Fail("the head is still running after " + std::to_string(wait_s) + " s");
}

// `troupe dashboard [RUN]`: the dashboard of a run from its folder alone
// (finished, or running elsewhere), until Ctrl-C.
int CmdDashboard(const std::string& runs_dir, std::vector<std::string> pos,
                 const std::string& bind) {
  if (pos.size() > 1) return Fail("dashboard takes at most a RUN argument", 2);
  auto run = ResolveRunDir(runs_dir, pos.empty() ? "" : pos[0]);
  if (!run.ok()) return Fail(run.status().message(), 2);  // an unknown RUN argument
  if (!fs::exists(run->metrics()))
    return Fail("'" + run->path + "' is not a run folder (no metrics.jsonl)", 2);
  DashboardOptions o;
  if (!bind.empty()) {
    Status b = ParseDashboardBind(bind, &o.bind, &o.port);
    if (!b.ok()) return Fail(b.message(), 2);
  }
  if (!IsLoopbackAddress(o.bind)) {
    auto token = NewDashboardToken();
    if (!token.ok()) return Fail(token.status().message());
    o.token = *token;
  }
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);  // before the server's threads start
  auto d = Dashboard::Start(*run, o);
  if (!d.ok()) return Fail(d.status().message());
  std::cout << "troupe: dashboard of " << run->path << "\ntroupe: dashboard " << (*d)->url()
            << "  (Ctrl-C to stop)\n"
            << std::flush;
  int sig = 0;
  sigwait(&set, &sig);
  return 0;
}

int CmdConfigKeys() {
  for (const auto& k : JobConfigKeys()) {
    if (k.type == "section") {
      std::cout << "\n" << k.path << ":  # " << k.doc << "\n";
    } else {
      std::cout << "  " << k.path << " (" << k.type << ", default "
                << (k.value.empty() ? "\"\"" : k.value) << "): " << k.doc << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe: launch and operate asynchronous RL jobs"};
  app.require_subcommand(1);
  std::string runs_dir = "runs";
  app.add_option("--runs-dir", runs_dir, "folder holding run folders")->capture_default_str();

  RunArgs ra;
  auto* run = app.add_subcommand("run", "launch a job and host its head");
  run->add_option("config", ra.config, "job config (YAML)");
  run->add_option("--set", ra.sets, "override a config key: --set trainer.lr=3e-4 (repeatable)");
  run->add_flag("--detach", ra.detach, "run the head in the background");
  run->add_flag("--submit", ra.submit,
                "submit the whole job to Slurm with sbatch (cluster.backend: slurm); the head "
                "runs inside the allocation");
  run->add_option("--resume", ra.resume,
                  "continue RUN (a run folder or name) from its last checkpoint");
  run->add_option("--log-level", ra.log_level, "head log level");
  run->add_option("--dashboard-bind", ra.dashboard_bind,
                  "serve the dashboard on ADDR[:PORT] (default 127.0.0.1, any free port); any "
                  "non-loopback address requires the token printed with the URL");

  std::vector<std::string> pos;
  bool with_stats = false;
  auto* status = app.add_subcommand("status", "table of the actors of a run");
  status->add_option("run", pos, "[RUN]");
  status->add_flag("-s,--stats", with_stats, "also print every actor's heartbeat statistics");

  bool all = false, follow = false;
  auto* logs = app.add_subcommand("logs", "show an actor's log ([RUN] ACTOR, or --all)");
  logs->add_option("args", pos, "[RUN] ACTOR");
  logs->add_flag("--all", all, "every actor, interleaved");
  logs->add_flag("-f,--follow", follow, "keep printing new lines");

  auto* scale =
      app.add_subcommand("scale", "set the number of actors of a role: [RUN] rollout=N [reward=M]");
  scale->add_option("specs", pos, "[RUN] ROLE=COUNT ...");

  int wait_s = 60;
  auto* stop =
      app.add_subcommand("stop", "stop a run gracefully (learner checkpoints, everyone exits)");
  stop->add_option("run", pos, "[RUN]");
  stop->add_option("--wait", wait_s, "seconds to wait for the head to exit (0: don't wait)");

  std::string dash_bind;
  auto* dash = app.add_subcommand(
      "dashboard",
      "serve a run's dashboard from its folder (a finished run, or one running elsewhere)");
  dash->add_option("run", pos, "[RUN]");
  dash->add_option("--bind", dash_bind,
                   "ADDR[:PORT] to listen on (default 127.0.0.1, any free port; other addresses "
                   "require the printed token)");

  auto* keys =
      app.add_subcommand("config-keys", "list every job config key with its type, default and doc");

  TokenizeArgs tokenize_args;
  auto* tokenize = AddTokenizeCommand(app, &tokenize_args);
  ChatTemplateArgs chat_template_args;
  auto* chat_template = AddChatTemplateCommand(app, &chat_template_args);
  ExportArgs export_args;
  auto* export_cmd = AddExportCommand(app, &export_args);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    return Fail(std::string(e.what()) + " (troupe --help lists the commands and options)", 2);
  }
  // Commands report expected failures as values; an exception escaping one
  // is a bug, but the CLI still ends with one line, never an abort.
  try {
    if (*run) {
      if (app.get_option("--runs-dir")->count()) ra.runs_dir = runs_dir;
      return CmdRun(ra);
    }
    if (*status) return CmdStatus(runs_dir, pos, with_stats);
    if (*logs) return CmdLogs(runs_dir, pos, all, follow);
    if (*scale) return CmdScale(runs_dir, pos);
    if (*stop) return CmdStop(runs_dir, pos, wait_s);
    if (*keys) return CmdConfigKeys();
    if (*dash) return CmdDashboard(runs_dir, pos, dash_bind);
    if (*tokenize) return RunTokenize(tokenize_args);
    if (*chat_template) return RunChatTemplate(chat_template_args);
    if (*export_cmd) return RunExport(runs_dir, export_args);
  } catch (const std::exception& e) {
    return Fail(std::string("unexpected error (please report it): ") + e.what(), 1);
  }
  return 2;
}
