// The reference actor. Every role follows the same five steps.
#include "troupe/actors/echo.h"

#include <chrono>
#include <thread>

#include "troupe/core/log.h"
#include "troupe/transport/message.h"

namespace troupe::actors {

Status RunEcho(ActorRuntime& runtime, transport::Network& network, const EchoOptions& options) {
  auto& log = log::Get("actors");

  // 1. Bind the sockets this actor serves. Port 0: the OS picks a free port;
  //    endpoint() reports the real one.
  auto bound = network.Bind(transport::SocketKind::kServer, "tcp://" + options.bind_host + ":0");
  if (!bound.ok()) return bound.status().WithContext("echo: bind");
  std::unique_ptr<transport::Socket> server = std::move(bound).value();

  // 2. Publish them and register: from now on the head lists this actor in
  //    the directory every other actor receives.
  runtime.AddEndpoint("echo", server->endpoint());
  TROUPE_RETURN_IF_ERROR(runtime.Register(Deadline::InMs(30000)));
  log.info("echo serving at {}", server->endpoint());

  // 3. Serve until the runtime says to exit (head stop/drain/shutdown,
  //    SIGTERM, or a silent head). Every wait is bounded so the loop notices.
  uint64_t echoed = 0, bad = 0;
  while (!runtime.should_exit()) {
    auto in = server->Recv(Deadline::InMs(100));
    if (!in.ok()) {
      if (transport::IsBadInput(in.status())) ++bad;  // already counted and logged by the transport
      continue;                                       // kTimeout: check should_exit() again
    }
    if (in->message.kind() != transport::MessageKind::ECHO) {
      log.warn("echo: ignoring a {} message from {}", transport::KindName(in->message.kind()),
               in->peer);
      continue;
    }
    // 4. Do the work: answer with the same text and payload. The payload is
    //    re-sent without a copy: the reply references the received frame.
    auto req = in->message.envelope().getBody().getEcho();
    transport::OutMessage reply;
    auto e = reply.envelope().getBody().initEcho();
    e.setText(req.getText());
    if (req.hasPayload()) {
      auto view = in->message.ReadTensor(req.getPayload(), "payload");
      if (view.ok()) {
        Status s =
            reply.SetTensor(e.initPayload(), view->dtype, view->shape,
                            transport::TensorBytes::FromView(*view, in->message.KeepAlive()));
        if (!s.ok()) log.warn("echo: payload not echoed: {}", s.ToString());
      }
    }
    Status s = server->SendTo(in->peer, reply, Deadline::InMs(1000));
    if (s.ok()) ++echoed;
    runtime.SetStat("echoed", static_cast<double>(echoed));
    runtime.SetStat("bad_input", static_cast<double>(bad));
  }

  // 5. Report final counters to the head's metrics sink and return: the
  //    runtime flushes logs and metrics when it is destroyed.
  runtime.SendMetrics(
      "final", 0, 0,
      {{"echoed", static_cast<double>(echoed)}, {"bad_input", static_cast<double>(bad)}});
  log.info("echo exiting ({}), echoed {} messages", ExitReasonName(runtime.exit_reason()), echoed);
  if (options.ignore_exit) {  // fault injection: stuck for good
    log.warn("fault injection (echo.stuck_actor): not returning");
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  return Status::Ok();
}

}  // namespace troupe::actors
