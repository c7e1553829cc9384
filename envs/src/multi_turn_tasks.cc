// Multi-turn built-in tasks: file_reverse and file_sort over a scratch
// workspace, and the wordle guessing game.
#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "generated_task.h"
#include "troupe/core/check.h"
#include "troupe/envs/episode.h"
#include "troupe/envs/tool_call.h"
#include "troupe/envs/wordle.h"
#include "troupe/envs/workspace.h"

namespace troupe::envs {
namespace {

using json = nlohmann::json;

const std::vector<std::string>& Words4() {
  static const std::vector<std::string> w = {
      "able", "acid", "aged", "also", "area", "army", "away", "baby", "back", "ball", "band",
      "bank", "base", "bath", "bear", "beat", "bell", "belt", "best", "bird", "blow", "blue",
      "boat", "body", "bold", "bone", "book", "boot", "born", "both", "bowl", "burn", "busy",
      "cake", "calm", "camp", "card", "care", "cart", "case", "cash", "cast", "cell", "chat",
      "chin", "chip", "city", "clay", "club", "coal", "coat", "code", "cold", "cook", "cool",
      "copy", "cord", "core", "corn", "cost", "crew", "crop", "cure", "dark", "dart", "data",
      "date", "dawn", "deal", "dear", "deep", "deer", "desk", "dial", "dice", "diet", "dish",
      "dock", "door", "dose", "down", "draw", "drop", "drum", "duck", "dust", "duty", "each",
      "earn", "ease", "east", "easy", "edge", "epic", "even", "exit", "face", "fact", "fair",
      "fall", "farm", "fast", "fear", "feed", "feel", "file", "fill", "film", "find", "fine",
      "fire", "fish", "five", "flag", "flat", "flow", "fold", "food", "foot", "fork", "form",
      "four", "free", "frog", "fuel", "full", "fund", "gain", "game", "gate", "gear", "gift",
      "girl", "give", "glad", "goal", "gold", "golf", "good", "grab", "gray", "grow", "hair",
      "half", "hall", "hand", "hard", "harm", "hawk", "head", "heat", "help", "herb", "hero",
      "hide", "high", "hill", "hint", "hold", "hole", "home", "hook", "hope", "horn", "host",
      "hour", "huge", "hunt", "idea", "iron", "item", "jazz", "join", "joke", "jump", "just",
      "keep", "kept", "kind", "king", "kite", "knee", "knot", "lake", "lamp", "land", "lane",
      "last", "late", "lazy", "lead", "leaf", "lean", "left", "lens", "life", "lift", "like",
      "lime", "line", "link", "lion", "list", "live", "load", "lock", "loft", "long", "look",
      "loop", "loud", "love", "luck", "made", "mail", "main", "make", "mark", "mask", "meal",
      "meat", "milk", "mind", "mint", "mist", "mode", "mood", "moon", "more", "moss", "most",
      "move", "much", "nail", "name", "near", "neck", "need", "nest", "news", "next", "nice",
      "nine", "note", "oven", "palm", "park", "part", "path", "peak", "pear", "pick", "pine",
      "pink", "plan", "play", "plot", "plug", "poem", "pond", "pool", "port", "pull", "pump",
      "pure", "push", "race", "rain", "rake", "rare", "rate", "read", "real", "rest", "rice",
      "rich", "ride", "ring", "rise", "road", "rock", "roof", "room", "root", "rope", "rose",
      "rule", "rust", "safe", "sail", "salt", "sand", "seal", "seed", "ship", "shoe", "shop",
      "silk", "sing", "size", "skin", "slow", "snow", "soap", "sock", "soft", "soil", "song",
      "soup", "spin", "star", "stem", "step", "stop", "swim", "tail", "tall", "tape", "task",
      "team", "tent", "test", "text", "tide", "tile", "time", "tiny", "tool", "town", "tree",
      "trip", "tube", "tune", "twin", "unit", "vase", "vast", "verb", "view", "vote", "wade",
      "wait", "walk", "wall", "warm", "wave", "weak", "wide", "wild", "wind", "wing", "wise",
      "wolf", "wood", "wool", "word", "work", "yard", "yarn", "year", "zero", "zone",
  };
  return w;
}

const std::vector<std::string>& Words5() {
  static const std::vector<std::string> w = {
      "about", "above", "actor", "adult", "after", "again", "agent", "agree", "alarm", "album",
      "alert", "alive", "allow", "alone", "along", "angle", "apple", "apply", "arena", "argue",
      "arise", "aside", "audio", "avoid", "award", "aware", "badge", "baker", "basic", "beach",
      "begin", "bench", "birth", "black", "blade", "blame", "blank", "blend", "blind", "block",
      "blood", "board", "boost", "brain", "brand", "brave", "bread", "break", "brick", "brief",
      "bring", "broad", "brown", "brush", "build", "cabin", "cable", "camel", "candy", "cargo",
      "carry", "catch", "cause", "chain", "chair", "chalk", "charm", "chart", "chase", "cheap",
      "check", "chess", "chest", "chief", "child", "civil", "claim", "class", "clean", "clear",
      "climb", "clock", "close", "cloth", "cloud", "coach", "coast", "coral", "count", "court",
      "cover", "craft", "crane", "cream", "crisp", "cross", "crowd", "crown", "curve", "cycle",
      "daily", "dance", "delta", "depth", "diary", "dirty", "dozen", "draft", "drama", "dream",
      "dress", "drink", "drive", "eagle", "early", "earth", "eight", "elbow", "empty", "enjoy",
      "enter", "equal", "error", "event", "exact", "extra", "fable", "faith", "false", "feast",
      "fence", "fever", "field", "final", "flame", "flash", "fleet", "float", "flock", "floor",
      "flour", "fluid", "focus", "forge", "forty", "frame", "fresh", "front", "frost", "fruit",
      "giant", "given", "glass", "globe", "glove", "grace", "grade", "grain", "grand", "grape",
      "grass", "great", "green", "greet", "grill", "group", "guard", "guess", "guest", "guide",
      "happy", "heart", "heavy", "hedge", "honey", "horse", "hotel", "house", "human", "humor",
      "ideal", "image", "index", "inner", "input", "ivory", "jelly", "jewel", "joint", "judge",
      "juice", "knife", "label", "large", "laser", "later", "laugh", "layer", "learn", "lemon",
      "level", "light", "limit", "linen", "local", "logic", "lucky", "lunar", "lunch", "magic",
      "major", "maple", "march", "match", "medal", "melon", "metal", "minor", "model", "money",
      "month", "motor", "mouse", "mouth", "movie", "music", "nerve", "night", "noble", "noise",
      "north", "novel", "ocean", "offer", "olive", "onion", "orbit", "order", "other", "otter",
      "owner", "paint", "panel", "paper", "party", "peace", "pearl", "pedal", "phase", "phone",
      "photo", "piano", "piece", "pilot", "pitch", "pizza", "place", "plain", "plane", "plant",
      "plate", "plaza", "point", "polar", "pound", "power", "press", "price", "pride", "prime",
      "print", "prize", "proud", "quart", "queen", "quick", "quiet", "quilt", "radio", "raise",
      "ranch", "range", "rapid", "raven", "reach", "ready", "rider", "ridge", "river", "roast",
      "robin", "robot", "rough", "round", "route", "royal", "rumor", "salad", "sauce", "scale",
      "scene", "scout", "shade", "shake", "shape", "share", "shark", "sharp", "sheep", "shelf",
      "shell", "shift", "shine", "shirt", "shore", "short", "skill", "slice", "slide", "smile",
      "smoke", "snake", "solid", "sound", "south", "space", "spark", "spice", "spoon", "sport",
      "squad", "stack", "staff", "stage", "stair", "stamp", "stand", "start", "steam", "steel",
      "stick", "stone", "storm", "story", "stove", "straw", "sugar", "sunny", "swift", "table",
      "taste", "teach", "thumb", "tiger", "toast", "token", "topic", "torch", "total", "tower",
      "track", "trade", "trail", "train", "treat", "trend", "trial", "tribe", "truck", "trust",
      "truth", "tulip", "uncle", "under", "union", "upper", "urban", "usual", "valid", "value",
      "vapor", "video", "visit", "vital", "vivid", "voice", "waste", "watch", "water", "whale",
      "wheat", "wheel", "white", "whole", "woman", "world", "worth", "wrist", "yield", "young",
      "youth", "zebra",
  };
  return w;
}

}  // namespace

const std::vector<std::string>& WordleWords(int length) {
  static const std::vector<std::string> empty;
  if (length == 4) return Words4();
  if (length == 5) return Words5();
  return empty;
}

std::string WordleFeedback(std::string_view secret, std::string_view guess) {
  TROUPE_CHECK_EQ(secret.size(), guess.size());
  std::string out(guess.size(), '.');
  int unmatched[256] = {};
  for (size_t i = 0; i < guess.size(); ++i) {
    if (guess[i] == secret[i]) {
      out[i] = 'G';
    } else {
      ++unmatched[static_cast<unsigned char>(secret[i])];
    }
  }
  for (size_t i = 0; i < guess.size(); ++i) {
    if (out[i] == 'G') continue;
    int& left = unmatched[static_cast<unsigned char>(guess[i])];
    if (left > 0) {
      out[i] = 'Y';
      --left;
    }
  }
  return out;
}

namespace detail {
namespace {

// FNV-1a: a portable hash for expert choices.
uint64_t Fnv(std::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (char c : s) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  return h;
}

bool IsLowerWord(std::string_view w, size_t max_len) {
  if (w.empty() || w.size() > max_len) return false;
  return std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; });
}

// The last tool message of a transcript (or nullptr).
const Message* LastTool(const Conversation& transcript) {
  for (auto it = transcript.rbegin(); it != transcript.rend(); ++it)
    if (it->role == Role::kTool) return &*it;
  return nullptr;
}

// Common base: multi-turn tasks are scored by their episode's record.
class MultiTurnTask : public GeneratedTask {
 public:
  using GeneratedTask::GeneratedTask;
  bool multi_turn() const override { return true; }
  VerifyResult Verify(const VerifyInput& input) const override {
    return VerifyFromEpisodeRecord(name(), input.metadata);
  }
  // The expert's transcript with the real tool outputs (default EpisodeConfig).
  Result<Conversation> Demonstration(const Prompt& prompt) const override {
    TextPolicy expert = [this](const Prompt& p, const Conversation& t) {
      Result<std::string> turn = ExpertTurn(p, t);
      return turn.ok() ? *turn : std::string();
    };
    TROUPE_ASSIGN_OR_RETURN(std::unique_ptr<Episode> ep,
                            PlayEpisode(*this, prompt, EpisodeConfig{}, expert));
    if (ep->score().reward < 1.0)
      return NotFound("the scripted expert did not solve prompt '{}' of task '{}' within {} turns",
                      prompt.id, name(), EpisodeConfig{}.max_turns);
    return ep->transcript();
  }

 protected:
  virtual const std::vector<ToolSpec>& Specs() const = 0;
  Conversation OpeningMessages(const GeneratedSample& sample) const override {
    Conversation c;
    if (config().tool_instructions) c.push_back(Message{Role::kSystem, ToolInstructions(Specs())});
    c.push_back(Message{Role::kUser, sample.user});
    return c;
  }
  // The "word" field of a prompt's metadata.
  Result<std::string> WordOf(const Prompt& prompt) const {
    json meta = json::parse(prompt.metadata, nullptr, false);
    if (meta.is_discarded() || !meta.is_object() || !meta.contains("word") ||
        !meta["word"].is_string())
      return InvalidArgument("prompt '{}' of task '{}' has no \"word\" in its metadata", prompt.id,
                             name());
    std::string w = meta["word"].get<std::string>();
    if (!IsLowerWord(w, 32))
      return InvalidArgument("prompt '{}': word must be 1-32 letters a-z", prompt.id);
    return w;
  }
  double Credit(std::string_view answer, std::string_view reference) const {
    double exact = ExactMatch(answer, reference);
    if (exact < 1.0 && config().scoring == "partial") return PositionalCredit(answer, reference);
    return exact;
  }
};

// Read w.txt and submit its word reversed.
class FileReverseTask final : public MultiTurnTask {
 public:
  using MultiTurnTask::MultiTurnTask;

  Result<std::unique_ptr<Environment>> NewEnvironment(const Prompt& prompt) const override {
    TROUPE_ASSIGN_OR_RETURN(std::string w, WordOf(prompt));
    std::string want(w.rbegin(), w.rend());
    auto scorer = [this, want](const Workspace&, const std::optional<std::string>& answer,
                               bool submitted) {
      VerifyResult r;
      r.scorer = name();
      r.reward = answer ? Credit(*answer, want) : 0.0;
      r.components = {{"submitted", submitted ? 1.0 : 0.0},
                      {"exact", answer ? ExactMatch(*answer, want) : 0.0}};
      return r;
    };
    return NewWorkspaceEnvironment(config().workspace, {{"w.txt", w}}, scorer);
  }

  Result<std::string> ExpertTurn(const Prompt& prompt,
                                 const Conversation& transcript) const override {
    const Message* last = LastTool(transcript);
    if (!last || last->content.rfind("error:", 0) == 0)
      return FormatToolCall("read", json{{"path", "w.txt"}});
    std::string w(TrimAscii(last->content));
    return FormatToolCall("submit", json{{"answer", std::string(w.rbegin(), w.rend())}});
  }

 protected:
  GeneratedSample Generate(Rng& rng) const override {
    std::string w = RandomWord(rng, config());
    std::string user = compact() ? "reverse the word in w.txt"
                                 : "The file w.txt holds one word. Read it, then submit the word "
                                   "spelled backwards: <tool>submit {\"answer\": \"...\"}</tool>";
    return {w, std::move(user), std::string(w.rbegin(), w.rend()), SafeDump(json{{"word", w}})};
  }
  double SpaceSize() const override { return WordSpace(config()); }
  const std::vector<ToolSpec>& Specs() const override { return WorkspaceToolSpecs(); }
};

// Write the sorted letters of in.txt to out.txt; scored from out.txt.
class FileSortTask final : public MultiTurnTask {
 public:
  using MultiTurnTask::MultiTurnTask;

  Result<std::unique_ptr<Environment>> NewEnvironment(const Prompt& prompt) const override {
    TROUPE_ASSIGN_OR_RETURN(std::string w, WordOf(prompt));
    std::string want = w;
    std::sort(want.begin(), want.end());
    auto scorer = [this, want](const Workspace& ws, const std::optional<std::string>&,
                               bool submitted) {
      VerifyResult r;
      r.scorer = name();
      Result<std::string> out =
          ws.ReadFile("out.txt");  // any workspace state is fine: errors score 0
      r.reward = out.ok() ? Credit(*out, want) : 0.0;
      r.components = {{"submitted", submitted ? 1.0 : 0.0},
                      {"out_readable", out.ok() ? 1.0 : 0.0},
                      {"exact", out.ok() ? ExactMatch(*out, want) : 0.0}};
      return r;
    };
    return NewWorkspaceEnvironment(config().workspace, {{"in.txt", w}}, scorer);
  }

  Result<std::string> ExpertTurn(const Prompt& prompt,
                                 const Conversation& transcript) const override {
    const Message* last = LastTool(transcript);
    if (!last || last->content.rfind("error:", 0) == 0)
      return FormatToolCall("read", json{{"path", "in.txt"}});
    if (last->content.rfind("wrote", 0) == 0) return FormatToolCall("submit");
    std::string w(TrimAscii(last->content));
    std::sort(w.begin(), w.end());
    return FormatToolCall("write", json{{"path", "out.txt"}, {"content", w}});
  }

 protected:
  GeneratedSample Generate(Rng& rng) const override {
    std::string w = RandomWord(rng, config());
    std::string sorted = w;
    std::sort(sorted.begin(), sorted.end());
    std::string user = compact()
                           ? "sort in.txt into out.txt"
                           : "Write the letters of the word in in.txt, sorted alphabetically, "
                             "to out.txt, then submit.";
    return {w, std::move(user), std::move(sorted), SafeDump(json{{"word", w}})};
  }
  double SpaceSize() const override { return WordSpace(config()); }
  const std::vector<ToolSpec>& Specs() const override { return WorkspaceToolSpecs(); }
};

class WordleEnvironment final : public Environment {
 public:
  WordleEnvironment(std::string secret, bool partial, std::string scorer)
      : secret_(std::move(secret)), partial_(partial), scorer_(std::move(scorer)) {}

  static const std::vector<ToolSpec>& Specs() {
    static const std::vector<ToolSpec> specs = {
        {"guess", R"({"word": str})",
         "guess the secret word; feedback G=right place, Y=elsewhere, .=absent"}};
    return specs;
  }
  const std::vector<ToolSpec>& tools() const override { return Specs(); }

  ToolResult Call(const std::string& name, const json& args) override {
    if (name != "guess") return ToolResult::Error(fmt::format("unknown tool '{}'", name));
    Status keys = CheckArgKeys(args, {"word"});
    if (!keys.ok()) return ToolResult::Error(keys.message());
    Result<std::string> word = StringArg(args, "word", 64);
    if (!word.ok()) return ToolResult::Error(word.status().message());
    if (word->size() != secret_.size() || !IsLowerWord(*word, secret_.size()))
      return ToolResult::Error(fmt::format("a guess is {} lowercase letters a-z", secret_.size()));
    ++guesses_;
    std::string fb = WordleFeedback(secret_, *word);
    int64_t greens = std::count(fb.begin(), fb.end(), 'G');
    best_greens_ = std::max(best_greens_, greens);
    if (greens == static_cast<int64_t>(secret_.size())) {
      solved_ = true;
      return ToolResult::Submit(fmt::format("{} {} solved", *word, fb));
    }
    return ToolResult::Ok(fmt::format("{} {}", *word, fb));
  }

  VerifyResult Score() override {
    VerifyResult r;
    r.scorer = scorer_;
    double len = static_cast<double>(secret_.size());
    r.reward = solved_ ? 1.0 : (partial_ ? 0.5 * static_cast<double>(best_greens_) / len : 0.0);
    r.components = {{"solved", solved_ ? 1.0 : 0.0},
                    {"guesses", static_cast<double>(guesses_)},
                    {"best_greens", static_cast<double>(best_greens_)}};
    return r;
  }

 private:
  std::string secret_;
  bool partial_;
  std::string scorer_;
  int64_t guesses_ = 0;
  int64_t best_greens_ = 0;
  bool solved_ = false;
};

class WordleTask final : public MultiTurnTask {
 public:
  using MultiTurnTask::MultiTurnTask;

  Result<std::unique_ptr<Environment>> NewEnvironment(const Prompt& prompt) const override {
    const std::string& s = prompt.reference;
    if (static_cast<int64_t>(s.size()) != config().word_length || !IsLowerWord(s, s.size()))
      return InvalidArgument("prompt '{}': the secret must be {} letters a-z", prompt.id,
                             config().word_length);
    return std::unique_ptr<Environment>(
        std::make_unique<WordleEnvironment>(s, config().scoring == "partial", name()));
  }

  // Guesses a word consistent with all feedback so far (chosen by a hash of
  // the prompt id and turn, so demonstrations vary).
  Result<std::string> ExpertTurn(const Prompt& prompt,
                                 const Conversation& transcript) const override {
    const auto& words = Words();
    std::vector<std::pair<std::string, std::string>> seen;  // guess, feedback
    for (const auto& m : transcript) {
      if (m.role != Role::kTool) continue;
      size_t sp = m.content.find(' ');
      if (sp == std::string::npos || m.content.rfind("error:", 0) == 0) continue;
      std::string g = m.content.substr(0, sp);
      std::string fb = m.content.substr(sp + 1, g.size());
      if (g.size() == fb.size()) seen.emplace_back(g, fb);
    }
    std::vector<const std::string*> candidates;
    for (const auto& w : words) {
      bool ok = true;
      for (const auto& [g, fb] : seen) ok = ok && WordleFeedback(w, g) == fb;
      if (ok) candidates.push_back(&w);
    }
    if (candidates.empty()) return NotFound("no word consistent with the feedback");
    uint64_t h = Fnv(prompt.id + "#" + std::to_string(transcript.size()));
    return FormatToolCall("guess", json{{"word", *candidates[h % candidates.size()]}});
  }

 protected:
  const std::vector<std::string>& Words() const {
    return WordleWords(static_cast<int>(config().word_length));
  }
  GeneratedSample Generate(Rng& rng) const override {
    const auto& words = Words();
    std::string secret =
        words[static_cast<size_t>(rng.Uniform(0, static_cast<int64_t>(words.size()) - 1))];
    int64_t n = config().word_length;
    std::string user =
        compact() ? fmt::format("guess the {}-letter word", n)
                  : fmt::format(
                        "Guess the secret {}-letter word with <tool>guess {{\"word\": \"...\"}}"
                        "</tool>. Feedback per letter: G right place, Y elsewhere in the "
                        "word, . not in the word.",
                        n);
    return {secret, std::move(user), secret, ""};
  }
  double SpaceSize() const override { return static_cast<double>(Words().size()); }
  const std::vector<ToolSpec>& Specs() const override { return WordleEnvironment::Specs(); }
};

}  // namespace

void AddMultiTurnTaskKinds(std::vector<TaskKind>* kinds) {
  kinds->push_back({"file_reverse", true, &BuildTask<FileReverseTask>});
  kinds->push_back({"file_sort", true, &BuildTask<FileSortTask>});
  kinds->push_back({"wordle", true, &BuildTask<WordleTask>});
}

}  // namespace detail
}  // namespace troupe::envs
