// Exit codes of the troupe-actor process: the contract between the actor
// host (actors/src/actor_main.cc) and the head's supervisor (launcher/).
#pragma once

namespace troupe {

inline constexpr int kExitOk = 0;        // the role finished (or was asked to stop)
inline constexpr int kExitError = 1;     // the role failed: the supervisor restarts it
inline constexpr int kExitBadSetup = 2;  // bad arguments, config or secrets
inline constexpr int kExitHeadLost = 3;  // the head went silent: the actor left on its own
// Restarting cannot help (the run folder cannot be written: disk full,
// read-only, gone): the head stops the job at once and reports the error.
inline constexpr int kExitFatal = 4;

}  // namespace troupe
