// `troupe chat-template DIR CONVERSATION.json`: a model folder's chat template
// from the shell (for users checking a folder, and for tests). Prints the text
// the template renders; with --ids, the ids and loss mask Troupe trains on.
// Torch-free: troupe::envs and troupe::tokenizer only.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace troupe::launcher {

struct ChatTemplateArgs {
  std::string dir;                // model folder (tokenizer_config.json; tokenizer.json for --ids)
  std::string conversation;       // JSON file: [messages] or {"messages": [...], "tools": [...], ...}
  bool ids = false;               // print prompt ids, response ids and loss mask instead of text
  bool generation_prompt = false;  // add_generation_prompt=true (text mode)
  std::vector<std::string> vars;  // NAME=JSON template variables, e.g. enable_thinking=false
};

// Registers the subcommand on `app`; parsed values land in *args.
CLI::App* AddChatTemplateCommand(CLI::App& app, ChatTemplateArgs* args);
// Returns the exit code: 0, 1 with one line naming the problem (file, message,
// template line), 2 for bad arguments.
int RunChatTemplate(const ChatTemplateArgs& args);

}  // namespace troupe::launcher
