// Typed reads of tokenizer.json / tokenizer_config.json fields with errors that name
// the component and key (private to engine/).
#pragma once

#include <initializer_list>
#include <string>

#include <nlohmann/json.hpp>

#include "troupe/core/status.h"

namespace troupe::engine::hf {

// Fails naming the first key of `j` that is not in `allowed`.
Status CheckKeys(const nlohmann::json& j, const std::string& where,
                 std::initializer_list<const char*> allowed);
// The field as a string/bool/integer; `fallback` when absent or null.
Result<std::string> StringField(const nlohmann::json& j, const char* key, const std::string& where,
                                const std::string& fallback = "");
Result<bool> BoolField(const nlohmann::json& j, const char* key, const std::string& where,
                       bool fallback = false);
Result<int64_t> IntField(const nlohmann::json& j, const char* key, const std::string& where,
                         int64_t fallback = 0);
// The "type" of a component object.
Result<std::string> TypeOf(const nlohmann::json& j, const std::string& where);

}  // namespace troupe::engine::hf
