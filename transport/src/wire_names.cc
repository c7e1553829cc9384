#include "troupe/transport/wire_names.h"

#include <capnp/schema.h>

namespace troupe::transport {
namespace {

template <typename E>
std::string EnumName(E value) {
  for (auto e : capnp::Schema::from<E>().getEnumerants())
    if (e.getOrdinal() == static_cast<uint16_t>(value)) return e.getProto().getName().cStr();
  return "unknown";
}

}  // namespace

std::string RoleName(wire::Role role) {
  return EnumName(role);
}

std::string StateName(wire::ActorState state) {
  return EnumName(state);
}

std::optional<wire::Role> RoleFromName(std::string_view name) {
  for (auto e : capnp::Schema::from<wire::Role>().getEnumerants()) {
    const auto n = e.getProto().getName();
    if (std::string_view(n.cStr(), n.size()) == name)
      return static_cast<wire::Role>(e.getOrdinal());
  }
  return std::nullopt;
}

}  // namespace troupe::transport
