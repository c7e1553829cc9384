// `troupe tokenize DIR`: a model folder's tokenizer from the shell (for users checking a
// folder, and for tests). Torch-free: it uses troupe::tokenizer only.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace troupe::launcher {

struct TokenizeArgs {
  std::string path;           // model folder or tokenizer.json
  bool decode = false;        // ids -> text instead of text -> ids
  bool no_special = false;    // encode: no post-processor tokens (HF add_special_tokens=False)
  bool skip_special = false;  // decode: drop special tokens
  bool json = false;          // text lines are JSON strings (so they can hold newlines)
};

// Registers the subcommand on `app`; parsed values land in *args.
CLI::App* AddTokenizeCommand(CLI::App& app, TokenizeArgs* args);
// Reads stdin, writes stdout: one output line per input line. Returns the exit code
// (1 with a message naming the line on the first bad line or a tokenizer that fails to load).
int RunTokenize(const TokenizeArgs& args);

}  // namespace troupe::launcher
