// The CLI side of the head's control socket (`troupe status|scale|stop`).
//
// Reads RUN/head.json (the endpoint) and RUN/secrets/curve.json (keys, when
// the job uses CURVE), connects a client socket with a unique identity, sends
// one Control request and waits for the matching ControlReply. Blocking, with
// a deadline; errors are one line naming the problem ("no head reachable at
// tcp://127.0.0.1:40123 (is the job still running?)").
#pragma once

#include <map>
#include <string>
#include <vector>

#include "troupe/core/deadline.h"
#include "troupe/core/status.h"
#include "troupe/launcher/head.h"
#include "troupe/launcher/run_dir.h"

namespace troupe::launcher {

struct HeadInfo {
  std::string endpoint;
  int pid = 0;
  std::string job;
  std::string host;  // machine the head runs on (its pid means nothing elsewhere); "" = unknown
  std::string dashboard;  // the dashboard's URL, without its token ("" = none)
};
Result<HeadInfo> ReadHeadInfo(const RunDir& run);
Status WriteHeadInfo(const RunDir& run, const HeadInfo& info);

struct ControlResult {
  std::string message;
  std::vector<ActorStatus> actors;
  std::map<std::string, double> progress;
};

// kind: "status" | "stop" | "scale"; for scale, `role` and `count`.
Result<ControlResult> SendControl(const RunDir& run, const std::string& kind, Deadline deadline,
                                  const std::string& role = "", uint32_t count = 0);

// Renders the `troupe status` table.
std::string FormatStatusTable(const ControlResult& r, bool with_stats = false);

}  // namespace troupe::launcher
