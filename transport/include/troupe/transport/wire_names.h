// Names of the wire schema's enums, read from the schema itself (Cap'n Proto
// reflection): "learner" <-> wire::Role::LEARNER, "ready" for
// wire::ActorState::READY. The one mapping between wire enums and the strings
// configs, logs and `troupe status` use.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "troupe/wire/troupe.capnp.h"

namespace troupe::transport {

// The enumerant's name in transport/schema/troupe.capnp ("unknown" for a
// value this build's schema does not know).
std::string RoleName(wire::Role role);
std::string StateName(wire::ActorState state);

// The role named `name`, or nullopt when the schema has no such role.
std::optional<wire::Role> RoleFromName(std::string_view name);

}  // namespace troupe::transport
