// multinode_probe: a stranger on the job's network, for multinode_test. For
// every endpoint given it tries what a peer without the job's keys can try and
// prints one line per attempt:
//
//   PROBE <endpoint> <attempt> <outcome>
//
// attempts
//   raw    a TCP connection that writes random bytes (not even ZMTP)
//   plain  a ZeroMQ DEALER without CURVE that sends well-formed Troupe messages
//          (Register, Heartbeat, a WeightsChunk with a 64 KiB payload claiming to
//          come from the learner) and garbage frames
//   curve  a CURVE client that knows the server's public key (--server-key) but
//          presents a key pair of its own, not the job's client key
// outcomes
//   accepted  the handshake completed or something answered (the test fails on it)
//   refused   the server failed the handshake or closed the connection
//   silent    nothing happened within the wait (also a failure to get in)
//
// usage: multinode_probe [--server-key Z85] [--wait-ms 3000] ENDPOINT...
// Exits 0 whatever the outcomes (the test reads them); 2 on bad arguments.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "troupe/transport/curve.h"
#include "troupe/transport/message.h"

namespace {

using troupe::transport::OutMessage;

std::mt19937_64 g_rng{std::random_device{}()};

std::string RandomBytes(size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(g_rng());
  return s;
}

// The frames a transport socket would send for `m` (header, then segments).
std::vector<std::string> Frames(const OutMessage& m) {
  m.Seal({"mallory", 42});
  std::string header;
  troupe::transport::EncodeHeader(m, 0, &header);
  std::vector<std::string> out{header};
  for (const auto& s : troupe::transport::Segments(m))
    out.emplace_back(static_cast<const char*>(s.data), s.size);
  return out;
}

// Well-formed messages a peer that knows the protocol would send.
std::vector<std::vector<std::string>> WellFormed() {
  std::vector<std::vector<std::string>> out;
  {
    OutMessage m;
    auto r = m.envelope();
    r.setSender("rollout-0");
    auto reg = r.initBody().initRegister();
    reg.setActorId("rollout-0");
    reg.setRole(troupe::wire::Role::ROLLOUT);
    auto eps = reg.initEndpoints(1);
    eps[0].setName("weights-data");
    eps[0].setAddress("tcp://10.78.0.15:1");
    out.push_back(Frames(m));
  }
  {
    OutMessage m;
    m.envelope().setSender("learner-0");
    m.envelope().initBody().initHeartbeat().setState(troupe::wire::ActorState::READY);
    out.push_back(Frames(m));
  }
  {
    // A valid-looking weight chunk: the learner's name, a plausible version, 64 KiB.
    OutMessage m;
    auto env = m.envelope();
    env.setSender("learner-0");
    auto c = env.initBody().initWeightsChunk();
    c.setVersion(1000000);
    c.setTransfer(1);
    c.setLast(true);
    std::string bytes = RandomBytes(64 * 1024);
    (void)m.SetTensorCopy(c.initPayload(), troupe::wire::DType::UINT8,
                          {static_cast<int64_t>(bytes.size())}, bytes.data(), bytes.size());
    out.push_back(Frames(m));
  }
  out.push_back({RandomBytes(7)});
  out.push_back({RandomBytes(64), RandomBytes(4096)});
  return out;
}

bool ParseTcp(const std::string& ep, sockaddr_in* sa) {
  if (ep.rfind("tcp://", 0) != 0) return false;
  auto colon = ep.rfind(':');
  std::string host = ep.substr(6, colon - 6);
  std::memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons(static_cast<uint16_t>(std::stoi(ep.substr(colon + 1))));
  return ::inet_pton(AF_INET, host.c_str(), &sa->sin_addr) == 1;
}

// Writes garbage to a plain TCP connection; "refused" when the server closes it.
std::string Raw(const std::string& ep, int wait_ms) {
  sockaddr_in sa;
  if (!ParseTcp(ep, &sa)) return "silent";
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    ::close(fd);
    return "refused";
  }
  std::string junk = RandomBytes(256);
  (void)::write(fd, junk.data(), junk.size());
  std::string outcome = "silent";
  for (int waited = 0; waited < wait_ms; waited += 100) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[512];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) {
      outcome = "refused";  // closed by the server
      break;
    }
    // A ZMTP greeting may come first; anything else would be an answer, but a greeting is
    // not: the connection still has to get through the mechanism's handshake.
  }
  ::close(fd);
  return outcome;
}

// A ZeroMQ client that sends everything in WellFormed() and reports what the handshake did.
std::string Zmq(void* ctx, const std::string& ep, const std::string& server_key, int wait_ms,
                int seq) {
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  int zero = 0;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  std::string id = "rollout-0/" + std::to_string(seq);  // a real actor's name
  zmq_setsockopt(s, ZMQ_ROUTING_ID, id.data(), id.size());
  if (!server_key.empty()) {
    auto mine = troupe::transport::GenerateCurveKeyPair();
    if (!mine.ok()) return "silent";
    zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, server_key.c_str(), 40);
    zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, mine->public_key.c_str(), 40);
    zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, mine->secret_key.c_str(), 40);
  }
  std::string mon = "inproc://probe-monitor-" + std::to_string(seq);
  zmq_socket_monitor(s, mon.c_str(),
                     ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                         ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                         ZMQ_EVENT_DISCONNECTED);
  void* m = zmq_socket(ctx, ZMQ_PAIR);
  zmq_connect(m, mon.c_str());
  zmq_connect(s, ep.c_str());
  for (const auto& msg : WellFormed()) {
    for (size_t i = 0; i < msg.size(); ++i)
      zmq_send(s, msg[i].data(), msg[i].size(),
               ZMQ_DONTWAIT | (i + 1 < msg.size() ? ZMQ_SNDMORE : 0));
  }
  std::string outcome = "silent";
  for (int waited = 0; waited < wait_ms && outcome != "accepted"; waited += 50) {
    zmq_pollitem_t items[2] = {{m, 0, ZMQ_POLLIN, 0}, {s, 0, ZMQ_POLLIN, 0}};
    if (zmq_poll(items, 2, 50) <= 0) continue;
    if (items[1].revents & ZMQ_POLLIN) outcome = "accepted";  // something answered
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    zmq_msg_t ev;
    zmq_msg_init(&ev);
    if (zmq_msg_recv(&ev, m, 0) < 0) continue;
    uint16_t event = 0;
    if (zmq_msg_size(&ev) >= 2) std::memcpy(&event, zmq_msg_data(&ev), 2);
    zmq_msg_close(&ev);
    zmq_msg_init(&ev);
    zmq_msg_recv(&ev, m, 0);  // the endpoint frame
    zmq_msg_close(&ev);
    if (event == ZMQ_EVENT_HANDSHAKE_SUCCEEDED) {
      outcome = "accepted";
    } else if (outcome == "silent") {
      outcome = "refused";
      break;  // the first refusal answers the question (the socket keeps retrying)
    }
  }
  zmq_socket_monitor(s, nullptr, 0);
  zmq_close(m);
  zmq_close(s);
  return outcome;
}

}  // namespace

int main(int argc, char** argv) {
  std::string server_key;
  int wait_ms = 3000;
  std::vector<std::string> endpoints;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--server-key" && i + 1 < argc) {
      server_key = argv[++i];
    } else if (a == "--wait-ms" && i + 1 < argc) {
      wait_ms = std::stoi(argv[++i]);
    } else if (a.rfind("tcp://", 0) == 0) {
      endpoints.push_back(a);
    } else {
      std::fprintf(stderr, "multinode_probe: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  void* ctx = zmq_ctx_new();
  int seq = 0;
  for (const auto& ep : endpoints) {
    std::printf("PROBE %s raw %s\n", ep.c_str(), Raw(ep, wait_ms).c_str());
    std::fflush(stdout);
    std::printf("PROBE %s plain %s\n", ep.c_str(), Zmq(ctx, ep, "", wait_ms, seq++).c_str());
    std::fflush(stdout);
    if (!server_key.empty()) {
      std::printf("PROBE %s curve %s\n", ep.c_str(),
                  Zmq(ctx, ep, server_key, wait_ms, seq++).c_str());
      std::fflush(stdout);
    }
  }
  zmq_ctx_term(ctx);
  return 0;
}
