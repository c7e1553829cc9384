// The echo actor: the smallest complete actor, kept as the reference for
// writing new roles (and as a light fixture for launcher tests).
//
//   any client ──Echo──▶ echo-N ──Echo (same text and payload)──▶ back
//
// Read src/echo.cc top to bottom: it shows every step a role takes — bind
// the sockets it serves, publish them at Register, serve until the runtime
// says to exit, report final counters, exit cleanly.
#pragma once

#include "troupe/actors/runtime.h"

namespace troupe::actors {

struct EchoOptions {
  std::string bind_host = "127.0.0.1";  // address the echo socket binds and advertises
  // Fault injection (echo.stuck_actor): after the runtime asks it to exit, the
  // role never returns, as one stuck in a collective would.
  bool ignore_exit = false;
};

// Runs the echo role until the runtime asks to exit. Returns the exit status.
Status RunEcho(ActorRuntime& runtime, transport::Network& network, const EchoOptions& options);

}  // namespace troupe::actors
