#include "troupe/jinja/template.h"

#include <fmt/format.h>

#include "interpreter.h"

namespace troupe::jinja {
namespace {

using internal::TemplateError;

Status ToStatus(const std::string& name, const TemplateError& e) {
  std::string where = e.line() > 0 ? fmt::format("template '{}' line {}", name, e.line())
                                   : fmt::format("template '{}'", name);
  return Status(e.limit() ? Code::kResourceExhausted : Code::kInvalidArgument,
                fmt::format("{}: {}", where, e.what()));
}

}  // namespace

Result<Template> Template::Parse(std::string_view source, std::string name) {
  auto program = std::make_shared<internal::Program>();
  program->name = std::move(name);
  try {
    program->body = internal::Parse(internal::Tokenize(source));
  } catch (const TemplateError& e) {
    return ToStatus(program->name, e);
  }
  return Template(std::move(program));
}

const std::string& Template::name() const { return program_->name; }

Result<std::string> Template::Render(const nlohmann::ordered_json& context,
                                     const RenderOptions& options) const {
  if (!context.is_object() && !context.is_null())
    return InvalidArgument("template '{}': the context must be a JSON object, got {}",
                           program_->name, context.type_name());
  try {
    internal::Interpreter interp(options);
    internal::Scope globals;
    interp.AddGlobals(&globals);
    for (auto it = context.begin(); it != context.end(); ++it) {
      if (globals.HasOwn(it.key()))
        return InvalidArgument("template '{}': context variable '{}' would replace a global",
                               program_->name, it.key());
      try {
        globals.Set(it.key(), internal::Value::FromJson(it.value()));
      } catch (const TemplateError& e) {
        return InvalidArgument("template '{}': context variable '{}': {}", program_->name,
                               it.key(), e.what());
      }
    }
    return interp.RenderTop(program_->body, globals);
  } catch (const TemplateError& e) {
    return ToStatus(program_->name, e);
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("template '{}': out of memory while rendering", program_->name);
  }
}

Result<std::string> ToJsonText(const nlohmann::ordered_json& value) {
  try {
    return internal::ToJson(internal::Value::FromJson(value), internal::JsonOptions{});
  } catch (const TemplateError& e) {
    return InvalidArgument("tojson: {}", e.what());
  }
}

}  // namespace troupe::jinja
