// The job config as users write it: every shipped config loads, a minimal one
// is valid with defaults, and bad values stop with an error naming the key and file.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "troupe/launcher/job_config.h"

namespace troupe::launcher {
namespace {

namespace fs = std::filesystem;

std::string SourceDir() {
  const char* s = std::getenv("TROUPE_SOURCE_DIR");
  return s ? s : ".";
}

// A config file under the test temp dir, removed when the test ends.
class ConfigFile {
 public:
  ConfigFile(const std::string& name, const std::string& text)
      : path_((fs::path(::testing::TempDir()) / (name + "." + std::to_string(::getpid()) + ".yaml"))
                  .string()) {
    std::ofstream(path_) << text;
  }
  ~ConfigFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  ConfigFile(const ConfigFile&) = delete;
  ConfigFile& operator=(const ConfigFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(JobConfig, EveryShippedConfigLoads) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(SourceDir() + "/configs")) {
    if (e.path().extension() != ".yaml") continue;
    auto c = LoadJobConfig(e.path().string(), {});
    EXPECT_TRUE(c.ok()) << e.path() << ": " << c.status().ToString();
    ++n;
  }
  EXPECT_GE(n, 1);
}

TEST(JobConfig, MinimalConfigIsValidWithDefaults) {
  // Defaults alone must describe a valid job (e.g. the model's vocabulary
  // follows the tokenizer unless set).
  ConfigFile minimal("minimal", "name: m\n");
  auto c = LoadJobConfig(minimal.path(), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_GE(c->model.vocab_size, 3 + static_cast<int64_t>(TokenizerAlphabet(c->tokenizer).size()));
  // The resolved config round-trips.
  ConfigFile resolved("resolved", ResolvedConfigYaml(*c));
  auto again = LoadResolvedConfig(resolved.path());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(ResolvedConfigYaml(*again), ResolvedConfigYaml(*c));
}

TEST(JobConfig, BadValuesNameTheKeyAndFile) {
  ConfigFile bad("bad", "name: b\n");
  const std::string& path = bad.path();
  struct Case {
    std::string set, key;
  };
  for (const Case& k : std::vector<Case>{{"trainer.max_policy_lag=-1", "max_policy_lag"},
                                         {"model.vocab_size=5", "model.vocab_size"},
                                         {"learner.count=0", "learner.count"},
                                         {"trainer.lrr=1", "trainer.lrr"}}) {
    auto c = LoadJobConfig(path, {k.set});
    ASSERT_FALSE(c.ok()) << k.set;
    EXPECT_NE(c.status().message().find(k.key), std::string::npos)
        << k.set << ": " << c.status().message();
    EXPECT_NE(c.status().message().find("bad"), std::string::npos) << c.status().message();
  }
}

TEST(JobConfig, AgentServersAreReadAndValidated) {
  ConfigFile cfg("agents", "name: a\nagent_servers: {math: 'http://127.0.0.1:9/', code: "
                           "'http://127.0.0.1:8'}\nagents: {max_concurrency: 4}\n");
  auto c = LoadJobConfig(cfg.path(), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->agents.enabled());
  EXPECT_EQ(c->agents.servers.at("math"), "http://127.0.0.1:9/");
  EXPECT_EQ(c->agents.max_concurrency, 4);
  EXPECT_EQ(c->agents.Route("nope"), "code");
  // Round trip through the resolved config.
  ConfigFile resolved("agents-resolved", ResolvedConfigYaml(*c));
  auto again = LoadResolvedConfig(resolved.path());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->agents.servers, c->agents.servers);
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"agent_servers={x: 'ftp://h'}", "http://"},
           {"agents.default_server=missing", "default_server"},
           {"agents.max_attempts=0", "max_attempts"},
           {"agents.run_timeout_ms=0", "run_timeout_ms"}}) {
    auto bad = LoadJobConfig(cfg.path(), {set});
    ASSERT_FALSE(bad.ok()) << set;
    EXPECT_NE(bad.status().message().find(key), std::string::npos) << bad.status().message();
    EXPECT_NE(bad.status().message().find("agents"), std::string::npos) << bad.status().message();
  }
}

TEST(JobConfig, LoraSectionBindsAndRefusesUnknownModulesByName) {
  ConfigFile f("lora", "name: l\nlora: {rank: 8, target_modules: [q_proj, v_proj, down_proj]}\n");
  auto c = LoadJobConfig(f.path(), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.lora.rank, 8);
  EXPECT_DOUBLE_EQ(c->model.lora.scale(), 1.0) << "alpha defaults to rank (PEFT)";
  EXPECT_EQ(c->model.lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  EXPECT_TRUE(c->engine.lora_merged);
  // The resolved config keeps it.
  ConfigFile resolved("lora_resolved", ResolvedConfigYaml(*c));
  auto again = LoadResolvedConfig(resolved.path());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->model.lora.ToString(), c->model.lora.ToString());
  for (const auto& [set, needle] : std::vector<std::pair<std::string, std::string>>{
           {"lora.target_modules=[q_proj, qkv]", "'qkv'"},
           {"lora.rank=-2", "lora.rank"},
           {"lora.dropout=1.5", "lora.dropout"},
           {"lora.ranks=4", "lora.ranks"}}) {
    auto bad = LoadJobConfig(f.path(), {set});
    ASSERT_FALSE(bad.ok()) << set;
    EXPECT_NE(bad.status().message().find(needle), std::string::npos)
        << set << ": " << bad.status().message();
  }
}

// Across nodes with CURVE on, the weight backends CURVE cannot cover (gloo's and NCCL's own
// connections) are refused unless the user consents with a key that names what it gives up.
TEST(JobConfig, UnauthenticatedWeightBackendsAcrossNodesNeedConsent) {
  ConfigFile remote("remote", "name: r\ncluster:\n  backend: ssh\n  hosts:\n    - name: h1\n");
  auto gloo = LoadJobConfig(remote.path(), {"broadcast.backend=gloo"});
  ASSERT_FALSE(gloo.ok());
  EXPECT_NE(gloo.status().message().find("broadcast.backend"), std::string::npos);
  EXPECT_NE(gloo.status().message().find("broadcast.allow_unauthenticated_gloo"), std::string::npos)
      << gloo.status().message();
  auto nccl = LoadJobConfig(remote.path(), {"broadcast.backend=nccl"});
  ASSERT_FALSE(nccl.ok());
  // (a build without NCCL refuses it for that reason first)
  EXPECT_NE(nccl.status().message().find("nccl"), std::string::npos) << nccl.status().message();
  EXPECT_TRUE(LoadJobConfig(remote.path(),
                            {"broadcast.backend=gloo", "broadcast.allow_unauthenticated_gloo=true"})
                  .ok());
  EXPECT_TRUE(LoadJobConfig(remote.path(), {"broadcast.backend=zmq"}).ok());
  // Without CURVE there is nothing to be consistent with; on one host gloo binds loopback.
  EXPECT_TRUE(LoadJobConfig(remote.path(), {"broadcast.backend=gloo", "cluster.curve=off"}).ok());
  ConfigFile local("local", "name: l\ncluster:\n  curve: on\nbroadcast:\n  backend: gloo\n");
  EXPECT_TRUE(LoadJobConfig(local.path(), {}).ok());
}

// Without broadcast.backend, the weights take the path that fits where the actors run: shared
// memory on one machine (CPU), zmq across nodes with CURVE on (the one it encrypts), gloo
// across nodes without; a backend the config names always wins.
TEST(JobConfig, TheDefaultWeightBackendFitsWhereTheActorsRun) {
  ConfigFile local("local_default", "name: l\n");
  ConfigFile remote("remote_default",
                    "name: r\ncluster:\n  backend: ssh\n  hosts:\n    - name: h1\n");
  struct Case {
    const ConfigFile* file;
    std::vector<std::string> sets;
    broadcast::Backend want;
  };
  for (const Case& c : {Case{&local, {}, broadcast::Backend::kShm},
                        Case{&local, {"broadcast.backend=gloo"}, broadcast::Backend::kGloo},
                        Case{&remote, {}, broadcast::Backend::kZmq},
                        Case{&remote, {"cluster.curve=off"}, broadcast::Backend::kGloo}}) {
    auto cfg = LoadJobConfig(c.file->path(), c.sets);
    ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
    EXPECT_EQ(cfg->broadcast.backend, c.want) << c.file->path() << " " << c.sets.size();
    if (c.want != broadcast::Backend::kShm) continue;
    // The resolved config (the run folder's config.yaml) names it: a resume keeps it.
    ConfigFile resolved("local_resolved", ResolvedConfigYaml(*cfg));
    auto again = LoadResolvedConfig(resolved.path());
    ASSERT_TRUE(again.ok()) << again.status().ToString();
    EXPECT_EQ(again->broadcast.backend, broadcast::Backend::kShm);
  }
}

// A tiny SentencePiece-style tokenizer.json (+ tokenizer_config.json) in a temp folder.
class TokenizerFolder {
 public:
  explicit TokenizerFolder(bool with_eos, const std::string& name = "hf-tok")
      : dir_(fs::path(::testing::TempDir()) / (name + "-" + std::to_string(::getpid()))) {
    fs::create_directories(dir_);
    std::ofstream(dir_ / "tokenizer.json") << R"({
      "version": "1.0", "truncation": null, "padding": null,
      "added_tokens": [
        {"id": 1, "content": "<s>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false},
        {"id": 2, "content": "</s>", "special": true, "normalized": false, "lstrip": false, "rstrip": false, "single_word": false}],
      "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
      "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": true,
                "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "a": 3, "b": 4, "ab": 5}, "merges": ["a b"]}})";
    std::ofstream(dir_ / "tokenizer_config.json")
        << (with_eos ? R"({"bos_token": "<s>", "eos_token": "</s>"})" : R"({"bos_token": "<s>"})");
  }
  ~TokenizerFolder() {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  TokenizerFolder(const TokenizerFolder&) = delete;
  TokenizerFolder& operator=(const TokenizerFolder&) = delete;
  const fs::path& dir() const { return dir_; }

 private:
  fs::path dir_;
};

TEST(JobConfig, HfTokenizerIsSelectedAndValidated) {
  ConfigFile job("hf", "name: h\n");
  TokenizerFolder folder(/*with_eos=*/true);
  auto c =
      LoadJobConfig(job.path(), {"tokenizer.kind=hf", "tokenizer.path=" + folder.dir().string()});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model.vocab_size, 6);  // the model follows the tokenizer's size
  auto tok = MakeTokenizer(c->tokenizer);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_EQ(*(*tok)->Encode("ab</s>b"), (std::vector<int32_t>{5, 2, 4}));
  // A relative path is made absolute (actors may run elsewhere).
  std::string relative = fs::relative(folder.dir() / "tokenizer.json", fs::current_path()).string();
  auto r = LoadJobConfig(job.path(), {"tokenizer.kind=hf", "tokenizer.path=" + relative});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(fs::path(r->tokenizer.path), (folder.dir() / "tokenizer.json").lexically_normal());
  // The resolved config keeps it.
  ConfigFile resolved("hf-resolved", ResolvedConfigYaml(*r));
  auto again = LoadResolvedConfig(resolved.path());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->tokenizer.path, r->tokenizer.path);
  // In a config file, a relative path is relative to the file's folder (not to the current
  // directory, where this one does not exist), so a shipped config runs from anywhere.
  const fs::path config_dir = fs::path(job.path()).parent_path();
  const std::string from_config = fs::relative(folder.dir(), config_dir).string();
  ASSERT_FALSE(fs::exists(fs::current_path() / from_config / "tokenizer.json")) << from_config;
  ConfigFile anchored("hf-anchored", "name: h\ntokenizer:\n  kind: hf\n  path: " + from_config + "\n");
  auto a = LoadJobConfig(anchored.path(), {});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(fs::path(a->tokenizer.path), folder.dir().lexically_normal());
  // ... and a --set value stays relative to the current directory.
  auto set = LoadJobConfig(anchored.path(), {"tokenizer.path=" + relative});
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(fs::path(set->tokenizer.path), (folder.dir() / "tokenizer.json").lexically_normal());
  // The default stays the character tokenizer.
  auto plain = LoadJobConfig(job.path(), {});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->tokenizer.kind, "char");
  EXPECT_EQ((*MakeTokenizer(plain->tokenizer))->vocab_size(), plain->model.vocab_size);
}

TEST(JobConfig, BadTokenizerSettingsNameTheKey) {
  ConfigFile job("hfbad", "name: h\n");
  TokenizerFolder no_eos(/*with_eos=*/false);
  struct Case {
    std::vector<std::string> sets;
    std::string want;
  };
  for (const Case& k : std::vector<Case>{
           {{"tokenizer.kind=hf"}, "key 'tokenizer.path': kind hf needs a model folder"},
           {{"tokenizer.kind=hf", "tokenizer.path=/nonexistent/m"},
            "key 'tokenizer.path': no tokenizer.json at /nonexistent/m"},
           {{"tokenizer.kind=bpe"}, "key 'tokenizer.kind': must be char or hf, got 'bpe'"},
           {{"tokenizer.path=/x"}, "key 'tokenizer.path': is only for kind hf"},
           {{"tokenizer.kind=hf", "tokenizer.path=" + no_eos.dir().string()}, "names no eos_token"},
           {{"tokenizer.kind=hf", "tokenizer.path=" + no_eos.dir().string(), "model.vocab_size=4"},
            "model.vocab_size"}}) {
    auto c = LoadJobConfig(job.path(), k.sets);
    ASSERT_FALSE(c.ok()) << k.want;
    EXPECT_NE(c.status().message().find(k.want), std::string::npos) << c.status().message();
  }
}

// A Hugging Face model folder: the tiny tokenizer above, a Qwen3 config.json, a
// generation_config.json with two EOS ids, and a (placeholder) weights file.
class ModelFolder {
 public:
  explicit ModelFolder(const std::string& name, const std::string& extra_config = "",
                       bool weights = true)
      : tok_(/*with_eos=*/true, name) {
    std::ofstream(tok_.dir() / "config.json") << R"({"architectures": ["Qwen3ForCausalLM"],
      "model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
      "intermediate_size": 64, "max_position_embeddings": 512, "vocab_size": 8,
      "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "tie_word_embeddings": true,
      "torch_dtype": "bfloat16", "eos_token_id": 2, "transformers_version": "4.51.0")" +
                                                     extra_config + "}";
    std::ofstream(tok_.dir() / "generation_config.json") << R"({"eos_token_id": [2, 1]})";
    if (weights) {
      const std::string header = R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
      std::ofstream out(tok_.dir() / "model.safetensors", std::ios::binary);
      uint64_t n = header.size();
      out.write(reinterpret_cast<const char*>(&n), 8);
      out << header << std::string(4, '\0');
    }
  }
  const fs::path& dir() const { return tok_.dir(); }

 private:
  TokenizerFolder tok_;
};

TEST(JobConfig, ModelFromAHuggingFaceFolder) {
  ModelFolder folder("model-from");
  ConfigFile job("from", "name: f\nmodel:\n  from: " + folder.dir().string() +
                              "\n  max_seq_len: 64\n  d_model: 32\n");
  auto c = LoadJobConfig(job.path(), {});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model_from, folder.dir().lexically_normal().string());
  {  // a relative model.from in a file is relative to the file's folder
    ConfigFile rel("from-rel", "name: f\nmodel:\n  from: " +
                                   fs::relative(folder.dir(), fs::path(job.path()).parent_path())
                                       .string() +
                                   "\n");
    auto r = LoadJobConfig(rel.path(), {});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->model_from, c->model_from);
  }
  EXPECT_EQ(c->model.architecture, "qwen3");
  EXPECT_TRUE(c->model.QkNorm());
  EXPECT_EQ(c->model.HeadDim(), 16);
  EXPECT_EQ(c->model.vocab_size, 8);
  EXPECT_EQ(c->model.max_seq_len, 64) << "the serving length stays the job's";
  EXPECT_EQ(c->model.max_position_embeddings, 512);
  EXPECT_EQ(c->model.dtype, engine::DType::kFloat32) << "the job computes in float32";
  EXPECT_EQ(c->tokenizer.kind, "hf");
  EXPECT_EQ(c->tokenizer.path, c->model_from);
  auto tok = MakeTokenizer(c->tokenizer);
  ASSERT_TRUE(tok.ok());
  auto stop = StopTokenIds(*c, **tok);
  ASSERT_TRUE(stop.ok());
  EXPECT_EQ(*stop, (std::vector<int32_t>{2, 1})) << "EOS, then generation_config.json's";
  // The resolved config reads back to the same job (its model.* keys repeat the folder's).
  ConfigFile resolved("from-resolved", ResolvedConfigYaml(*c));
  auto again = LoadResolvedConfig(resolved.path());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->model.ToString(), c->model.ToString());
  EXPECT_EQ(again->model_from, c->model_from);
  // The files that make a checkpoint a Hugging Face folder.
  auto files = HfCompanionFiles(*c, **tok);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  std::map<std::string, std::string> by_name(files->begin(), files->end());
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json"})
    EXPECT_EQ(by_name.count(name), 1u) << name;
  auto written = engine::ModelConfigFromHfJson(by_name["config.json"], 64);
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(written->ToString(), c->model.ToString());
  EXPECT_NE(by_name["config.json"].find("\"transformers_version\": \"4.51.0\""), std::string::npos)
      << "informational keys of the source survive";
  EXPECT_NE(by_name["generation_config.json"].find("\"eos_token_id\""), std::string::npos);
}

TEST(JobConfig, ModelFromErrorsNameTheKey) {
  ModelFolder good("good");
  ModelFolder unsupported("unsupported", R"(, "quantization_config": {"bits": 4})");
  ModelFolder no_weights("no-weights", "", /*weights=*/false);
  ConfigFile job("from-bad", "name: f\n");
  struct Case {
    std::vector<std::string> sets;
    std::string want;
  };
  for (const Case& k : std::vector<Case>{
           {{"model.from=/nonexistent/folder"}, "key 'model.from': model folder '/nonexistent"},
           {{"model.from=" + unsupported.dir().string()}, "key 'quantization_config' is not supported"},
           {{"model.from=" + no_weights.dir().string()}, "has no weights"},
           {{"model.from=" + good.dir().string(), "model.d_model=64"},
            "key 'model.d_model': 64 differs from"},
           {{"model.from=" + good.dir().string(), "model.architecture=llama"},
            "key 'model.architecture': llama differs"},
           {{"model.from=" + good.dir().string(), "model.max_seq_len=1024"},
            "key 'model.max_seq_len': 1024 exceeds the 512 positions"},
           {{"model.from=" + good.dir().string(), "chat.format=compact", "chat.variables={x: 'nope'}"},
            "chat.variables.x"},
           {{"chat.format=template"}, "key 'chat': chat.format is template but"},
           {{"chat.format=fancy"}, "chat.format 'fancy'"},
       }) {
    auto c = LoadJobConfig(job.path(), k.sets);
    ASSERT_FALSE(c.ok()) << k.want;
    EXPECT_NE(c.status().message().find(k.want), std::string::npos) << c.status().message();
  }
}

}  // namespace
}  // namespace troupe::launcher
