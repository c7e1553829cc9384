// The reference side of Troupe's tokenizer parity test and benchmark: runs Hugging
// Face's tokenizers.js (@huggingface/tokenizers, installed by
// scripts/install-npm-reference.sh into this folder) on a tokenizer.json and answers
// requests.
//
//   node tokenizer_reference.mjs TOKENIZER_JSON [CONFIG_JSON]          (requests on stdin)
//   node tokenizer_reference.mjs TOKENIZER_JSON [CONFIG_JSON] --bench TEXTS_FILE SECONDS
//
// Requests (stdin, binary, little-endian), read to the end, answered in order on stdout:
//   [u8 op][u32 n][n bytes]
//   op 'E': encode the bytes (decoded as TextDecoder does: ill-formed UTF-8 -> U+FFFD,
//           BOM kept) with add_special_tokens=false; answer ids, then decode(ids).
//   op 'S': the same with add_special_tokens=true; answer ids only.
//   op 'D' / 'K': the bytes are int32 ids; answer decode(ids) with skip_special_tokens
//           false / true.
// Answers: [u8 status][u32 n][n bytes]: status 0 ok, 1 the reference threw (the bytes
// are its message). Ok payloads: ids as [u32 count][count x int32] (+ [u32 n][n UTF-8
// bytes] of the decoded text for 'E'); decoded text as UTF-8 bytes.
//
// --bench: TEXTS_FILE is JSONL, one {"text": ...} per line; encodes every text
// (add_special_tokens=false) repeatedly for at least SECONDS after one warm-up pass and
// prints one JSON line {"bytes", "seconds", "mb_per_s", "cpu_seconds", "mb_per_cpu_s",
// "tokens"} (bytes of UTF-8 text encoded; CPU time of the whole process, garbage
// collector included; tokens of one pass).
import fs from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const args = process.argv.slice(2);
const benchAt = args.indexOf("--bench");
const files = benchAt >= 0 ? args.slice(0, benchAt) : args;
const tokenizerJson = JSON.parse(fs.readFileSync(files[0], "utf8"));
const config = files[1] ? JSON.parse(fs.readFileSync(files[1], "utf8")) : {};
const tok = new Tokenizer(tokenizerJson, config);
const utf8In = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });

if (benchAt >= 0) {
  const lines = fs.readFileSync(args[benchAt + 1], "utf8").split("\n").filter((l) => l.length > 0)
    .map((l) => JSON.parse(l).text);
  const seconds = Number(args[benchAt + 2] ?? "2");
  const bytesPerPass = lines.reduce((n, l) => n + Buffer.byteLength(l, "utf8"), 0);
  let tokens = 0;
  for (const l of lines) tokens += tok.encode(l, { add_special_tokens: false }).ids.length;
  let bytes = 0;
  const t0 = process.hrtime.bigint();
  const cpu0 = process.cpuUsage();
  let elapsed = 0;
  do {
    for (const l of lines) tok.encode(l, { add_special_tokens: false });
    bytes += bytesPerPass;
    elapsed = Number(process.hrtime.bigint() - t0) / 1e9;
  } while (elapsed < seconds);
  const cpu = process.cpuUsage(cpu0);
  const cpuSeconds = (cpu.user + cpu.system) / 1e6;
  console.log(JSON.stringify({ bytes, seconds: elapsed, mb_per_s: bytes / 1e6 / elapsed,
                               cpu_seconds: cpuSeconds, mb_per_cpu_s: bytes / 1e6 / cpuSeconds, tokens }));
  process.exit(0);
}

const input = fs.readFileSync(0);
const out = [];
const u32 = (n) => {
  const b = Buffer.alloc(4);
  b.writeUInt32LE(n);
  return b;
};
const idsBuffer = (ids) => {
  const b = Buffer.alloc(4 + 4 * ids.length);
  b.writeUInt32LE(ids.length, 0);
  ids.forEach((id, i) => {
    if (!Number.isInteger(id)) throw new Error(`non-integer id ${id} at ${i}`);
    b.writeInt32LE(id, 4 + 4 * i);
  });
  return b;
};
const textBuffer = (s) => {
  const b = Buffer.from(s, "utf8");
  return Buffer.concat([u32(b.length), b]);
};
const decode = (ids, skip) => (ids.length === 0 ? "" : tok.decode(ids, { skip_special_tokens: skip }));
const answer = (status, payload) => out.push(Buffer.from([status]), u32(payload.length), payload);

for (let at = 0; at < input.length; ) {
  const op = String.fromCharCode(input[at]);
  const n = input.readUInt32LE(at + 1);
  const body = input.subarray(at + 5, at + 5 + n);
  at += 5 + n;
  try {
    if (op === "E" || op === "S") {
      const ids = tok.encode(utf8In.decode(body), { add_special_tokens: op === "S" }).ids;
      const parts = [idsBuffer(ids)];
      if (op === "E") parts.push(textBuffer(decode(ids, false)));
      answer(0, Buffer.concat(parts));
    } else if (op === "D" || op === "K") {
      const ids = [];
      for (let i = 0; i + 4 <= body.length; i += 4) ids.push(body.readInt32LE(i));
      answer(0, Buffer.from(decode(ids, op === "K"), "utf8"));
    } else {
      throw new Error(`unknown op ${op}`);
    }
  } catch (e) {
    answer(1, Buffer.from(String(e?.message ?? e), "utf8"));
  }
}
const all = Buffer.concat(out);
for (let off = 0; off < all.length; ) off += fs.writeSync(1, all, off, all.length - off);
