#include "tokenize_cmd.h"

#include <iostream>

#include <nlohmann/json.hpp>

#include "troupe/core/log.h"
#include "troupe/engine/hf_tokenizer.h"

namespace troupe::launcher {

CLI::App* AddTokenizeCommand(CLI::App& app, TokenizeArgs* a) {
  auto* cmd = app.add_subcommand(
      "tokenize",
      "tokenize stdin with a model folder's tokenizer.json: one line of text in, one JSON list "
      "of ids out (--decode: the reverse)");
  cmd->add_option("dir", a->path,
                  "model folder (tokenizer.json, tokenizer_config.json) or tokenizer.json")
      ->required();
  cmd->add_flag("--decode", a->decode, "read JSON lists of ids, write the text");
  cmd->add_flag("--no-special", a->no_special,
                "encode without the post-processor's special tokens (BOS of Llama 3, ...); "
                "the default adds them, as Hugging Face's tokenizer(text) does");
  cmd->add_flag("--skip-special", a->skip_special, "decode: leave out special tokens");
  cmd->add_flag(
      "--json", a->json,
      "text lines are JSON strings (encode input, decode output), so text may hold newlines");
  return cmd;
}

int RunTokenize(const TokenizeArgs& a) {
  log::Options quiet;
  quiet.level = spdlog::level::warn;  // stdout is the output; no info lines on stderr either
  log::Init("troupe", quiet);
  auto tok = engine::HfTokenizer::Load(a.path);
  if (!tok.ok()) {
    std::cerr << "troupe tokenize: " << tok.status().message() << "\n";
    return 1;
  }
  std::string line;
  for (size_t n = 1; std::getline(std::cin, line); ++n) {
    auto fail = [&](const std::string& why) {
      std::cerr << "troupe tokenize: stdin line " << n << ": " << why << "\n";
      return 1;
    };
    if (a.decode) {
      nlohmann::json ids = nlohmann::json::parse(line, nullptr, false);
      if (ids.is_discarded() || !ids.is_array()) return fail("not a JSON list of token ids");
      std::vector<int32_t> v;
      for (const auto& id : ids) {
        if (!id.is_number_integer()) return fail("not a JSON list of token ids");
        v.push_back(id.get<int32_t>());
      }
      auto text = (*tok)->Decode(v, a.skip_special);
      if (!text.ok()) return fail(text.status().message());
      std::cout << (a.json ? nlohmann::json(*text).dump() : *text) << std::endl;
      continue;
    }
    std::string text = line;
    if (a.json) {
      nlohmann::json s = nlohmann::json::parse(line, nullptr, false);
      if (s.is_discarded() || !s.is_string()) return fail("not a JSON string");
      text = s.get<std::string>();
    }
    auto ids = a.no_special ? (*tok)->Encode(text) : (*tok)->EncodeWithSpecialTokens(text);
    if (!ids.ok()) return fail(ids.status().message());
    std::cout << nlohmann::json(*ids).dump() << std::endl;
  }
  return 0;
}

}  // namespace troupe::launcher
