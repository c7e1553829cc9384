#include "hf/json_fields.h"

namespace troupe::engine::hf {

Status CheckKeys(const nlohmann::json& j, const std::string& where,
                 std::initializer_list<const char*> allowed) {
  for (const auto& item : j.items()) {
    bool known = false;
    for (const char* k : allowed) known = known || item.key() == k;
    if (!known) return InvalidArgument("{}: option '{}' is not supported", where, item.key());
  }
  return Status::Ok();
}

Result<std::string> StringField(const nlohmann::json& j, const char* key, const std::string& where,
                                const std::string& fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_string())
    return InvalidArgument("{}: '{}' must be a string, got {}", where, key, it->dump());
  return it->get<std::string>();
}

Result<bool> BoolField(const nlohmann::json& j, const char* key, const std::string& where,
                       bool fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    return InvalidArgument("{}: '{}' must be true or false, got {}", where, key, it->dump());
  return it->get<bool>();
}

Result<int64_t> IntField(const nlohmann::json& j, const char* key, const std::string& where,
                         int64_t fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer())
    return InvalidArgument("{}: '{}' must be an integer, got {}", where, key, it->dump());
  return it->get<int64_t>();
}

Result<std::string> TypeOf(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object())
    return InvalidArgument("{}: must be an object, got {}", where, j.dump().substr(0, 80));
  auto it = j.find("type");
  if (it == j.end() || !it->is_string()) return InvalidArgument("{}: has no \"type\"", where);
  return it->get<std::string>();
}

}  // namespace troupe::engine::hf
