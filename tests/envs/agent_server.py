#!/usr/bin/env python3
"""A reference NeMo Gym-style agent server (Python standard library only).

Start: agent_server.py [--host 127.0.0.1] [--port 0] [--max-turns 4]
                       [--max-response-tokens 100] [--transcripts FILE] [--stream]
It prints "PORT <n>" on stdout once it listens, then serves until killed, and
exits by itself when its parent process goes away (no orphans).

POST /run plays the file_reverse tool task through the OpenAI-compatible
endpoint it is handed, the way a NeMo Gym agent does:

  request   {"responses_create_params": {"input": [messages], "model", "temperature",
             "top_p", "max_output_tokens"}, "word": ..., "base_url", "api_key", "episode_id"}
  loop      POST {base_url}/chat/completions (Bearer api_key) with the messages so far;
            each assistant message sent back carries the prompt_token_ids and
            generation_token_ids the endpoint returned, so turns extend each other
            token for token. The reply's Troupe tool call <tool>NAME {json}</tool> runs
            here: read {"path": "w.txt"} answers with the word, list lists w.txt,
            submit {"answer": ...} ends the episode; anything else answers with
            "error: ..." as the built-in environment does.
  answer    {"responses_create_params", "response": {"output": [items]}, "reward"}
            items: function_call / message (with prompt_token_ids, generation_token_ids,
            generation_log_probs), function_call_output; reward = positional credit of
            the submitted answer against the reversed word.

--stream makes every model call with "stream": true and rebuilds the reply from the
server-sent events (the content deltas, the last chunk's training fields), as a
streaming OpenAI client does.

POST /single/run plays any single-turn task: one model call with the task's
messages, reward 1 when the reply (stripped) equals the task's reference, else 0.

Faults by path prefix (the rollout actor POSTs {url}/run, so a server URL of
http://host:port/fault/<kind> selects one):
  /fault/error/run          {"error": "..."} with reward 0
  /fault/empty/run          an empty output list
  /fault/status/<code>/run  that HTTP status
  /fault/logprobs/run       plays, then perturbs one log-prob (ledger mismatch)
  /fault/rewrite/run        plays, then drops a token of a later turn's prompt
  /fault/slow/<s>/run       sleeps <s> seconds first
GET /stats -> {"runs": n, "model_calls": n, "max_inflight": n, "paths": {path: count}}
"""
import argparse
import json
import os
import re
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
STATS = {"runs": 0, "model_calls": 0, "max_inflight": 0, "inflight": 0, "paths": {}}
ARGS = None
TOOL_RE = re.compile(r"<tool>\s*([a-z][a-z0-9_]{0,31})\s*(\{.*\})?\s*</tool>", re.S)


def positional_credit(answer, reference):
    a, b = answer.strip(), reference.strip()
    if not a and not b:
        return 1.0
    same = sum(1 for x, y in zip(a, b) if x == y)
    return same / max(len(a), len(b))


def read_stream(r):
    """The chat.completion a stream of chat.completion.chunk events adds up to (choice 0)."""
    content, final, error = "", None, None
    for line in r:
        line = line.strip()
        if not line.startswith(b"data: "):
            continue  # blank separators and SSE comments
        data = line[len(b"data: "):]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            error = chunk
            continue
        for c in chunk.get("choices") or []:
            if c.get("index", 0) != 0:
                continue
            content += (c.get("delta") or {}).get("content") or ""
            if c.get("finish_reason") is not None:
                final = c
    if error is not None or final is None:
        return 500, error or {"error": {"message": "the stream ended without a final chunk"}}
    msg = {"role": "assistant", "content": content}
    for k in ("prompt_token_ids", "generation_token_ids", "generation_log_probs"):
        msg[k] = final[k]
    return 200, {"choices": [{"index": 0, "message": msg, "finish_reason": final["finish_reason"]}]}


def call_model(base_url, api_key, body, timeout):
    if ARGS.stream:
        body = dict(body, stream=True)
    req = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer " + api_key},
        method="POST",
    )
    with LOCK:
        STATS["model_calls"] += 1
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            if ARGS.stream:
                return read_stream(r)
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.loads(e.read())
        except ValueError:
            return e.code, {"error": {"message": "HTTP %d" % e.code}}


# The built-in file_reverse environment's tools and its answer to a reply without a call
# (envs/src/episode.cc), word for word: the agent path and the EpisodeDriver then play the
# same episodes (the same environment tokens), which the benchmark's comparison needs.
TOOLS = "read, write, edit, list, submit"
NO_CALL = "error: no tool call found; write <tool>name {json arguments}</tool> (tools: %s)" % TOOLS


def run_tool(text, word):
    """(output text or None, submitted answer or None) for one reply."""
    m = TOOL_RE.search(text)
    if not m:
        return NO_CALL, None
    name, raw = m.group(1), m.group(2) or "{}"
    try:
        args = json.loads(raw)
    except ValueError:
        return "error: unparsable tool call: arguments are not a JSON object", None
    if not isinstance(args, dict):
        return "error: unparsable tool call: arguments are not a JSON object", None
    if name == "read":
        path = args.get("path")
        if not isinstance(path, str):
            return "error: argument 'path' must be a string", None
        if path.strip("./") != "w.txt":
            return "error: no such file: %s" % path, None
        return word, None
    if name == "list":
        return "w.txt %d\n" % len(word), None
    if name == "submit":
        ans = args.get("answer", "")
        return None, ans if isinstance(ans, str) else ""
    return "error: unknown tool '%s' (tools: %s)" % (name, TOOLS), None


def play_single(run):
    params = run.get("responses_create_params") or {}
    body = {"model": run.get("model") or params.get("model"), "messages": params.get("input") or [],
            "max_tokens": int(params.get("max_output_tokens") or 16),
            "temperature": params.get("temperature", 1.0), "top_p": params.get("top_p", 1.0)}
    status, resp = call_model(run["base_url"], run.get("api_key", ""), body, ARGS.call_timeout)
    if status != 200:
        return {"error": "model call failed: HTTP %d %s" % (status, resp.get("error"))}
    msg = resp["choices"][0]["message"]
    text = msg.get("content") or ""
    reference = (run.get("task") or {}).get("reference") or ""
    item = dict(type="message", id="msg_0", role="assistant",
                content=[{"type": "output_text", "text": text}],
                **{k: msg[k] for k in ("prompt_token_ids", "generation_token_ids",
                                       "generation_log_probs")})
    return {"responses_create_params": params, "response": {"output": [item]},
            "reward": 1.0 if text.strip() == reference.strip() else 0.0}


def play(run):
    params = run.get("responses_create_params") or {}
    messages = [dict(m) for m in params.get("input") or []]
    word = run.get("word") or ((run.get("task") or {}).get("metadata") or {}).get("word") or ""
    want = word[::-1]
    output, reward, first_prompt_len = [], 0.0, None
    for turn in range(ARGS.max_turns):
        max_tokens = int(params.get("max_output_tokens") or 48)
        if first_prompt_len is not None:
            used = len(messages[-2]["prompt_token_ids"]) + len(messages[-2]["generation_token_ids"])
            left = ARGS.max_response_tokens - (used - first_prompt_len)
            if left <= 0:
                break
            max_tokens = min(max_tokens, left)
        body = {"model": run.get("model") or params.get("model"), "messages": messages,
                "max_tokens": max_tokens, "temperature": params.get("temperature", 1.0),
                "top_p": params.get("top_p", 1.0)}
        status, resp = call_model(run["base_url"], run.get("api_key", ""), body, ARGS.call_timeout)
        if status != 200:
            if status == 413 and output:  # the context is full: the episode ends here
                break
            return {"error": "model call failed: HTTP %d %s" % (status, resp.get("error"))}
        msg = resp["choices"][0]["message"]
        text = msg.get("content") or ""
        ids = {k: msg[k] for k in ("prompt_token_ids", "generation_token_ids", "generation_log_probs")}
        if first_prompt_len is None:
            first_prompt_len = len(ids["prompt_token_ids"])
        out_text, answer = run_tool(text, word)
        call_id = "call_%d" % turn
        m = TOOL_RE.search(text)
        if m:
            output.append(dict(type="function_call", id="fc_%d" % turn, call_id=call_id,
                               name=m.group(1), arguments=m.group(2) or "{}", **ids))
        else:
            output.append(dict(type="message", id="msg_%d" % turn, role="assistant",
                               content=[{"type": "output_text", "text": text}], **ids))
        messages.append({"role": "assistant", "content": text,
                         "prompt_token_ids": ids["prompt_token_ids"],
                         "generation_token_ids": ids["generation_token_ids"]})
        if answer is not None:
            reward = positional_credit(answer, want)
            break
        if turn + 1 == ARGS.max_turns:
            break  # the built-in environment shows no output after the last turn
        # Every tool message the model is shown is an output item (a reply without a call
        # gets the same "error: ..." answer the built-in environment gives).
        output.append({"type": "function_call_output", "call_id": call_id, "output": out_text})
        messages.append({"role": "tool", "content": out_text})
    return {"responses_create_params": params, "response": {"output": output}, "reward": reward}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):
        pass

    def _send(self, code, obj):
        data = json.dumps(obj).encode()
        self._done()  # before the reply leaves: the client may call again as soon as it has it
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/stats":
            with LOCK:
                self._send(200, {k: v for k, v in STATS.items() if k != "inflight"})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with LOCK:
            STATS["paths"][self.path] = STATS["paths"].get(self.path, 0) + 1
            STATS["inflight"] += 1
            STATS["max_inflight"] = max(STATS["max_inflight"], STATS["inflight"])
        self._counted = True
        try:
            self._handle(raw)
        finally:
            self._done()

    def _done(self):
        """Stops counting this request as in flight (once)."""
        if getattr(self, "_counted", False):
            self._counted = False
            with LOCK:
                STATS["inflight"] -= 1

    def _handle(self, raw):
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        if not parts or parts[-1] != "run":
            return self._send(404, {"error": "unknown path"})
        try:
            run = json.loads(raw or b"{}")
        except ValueError:
            return self._send(400, {"error": "request is not JSON"})
        fault = parts[1] if len(parts) >= 3 and parts[0] == "fault" else ""
        with LOCK:
            STATS["runs"] += 1
        if fault == "error":
            return self._send(200, {"error": "the environment failed", "reward": 0.0})
        if fault == "empty":
            return self._send(200, {"response": {"output": []}, "reward": 0.0})
        if fault == "status":
            return self._send(int(parts[2]), {"error": "as requested"})
        if fault == "slow":
            time.sleep(float(parts[2]))
        result = play_single(run) if parts[0] == "single" else play(run)
        model_items = [i for i in result.get("response", {}).get("output", [])
                       if "generation_log_probs" in i]
        if fault == "logprobs" and model_items:
            lp = model_items[0]["generation_log_probs"]
            lp[0] = lp[0] - 0.5
        if fault == "rewrite" and len(model_items) > 1:
            model_items[1]["prompt_token_ids"] = model_items[1]["prompt_token_ids"][:-2] + \
                model_items[1]["prompt_token_ids"][-1:]
        if ARGS.transcripts and "error" not in result:
            with LOCK, open(ARGS.transcripts, "a") as f:
                f.write(json.dumps({"episode_id": run.get("episode_id"), "word": run.get("word"),
                                    "output": result["response"]["output"],
                                    "reward": result["reward"]}) + "\n")
        self._send(200, result)


class Server(ThreadingHTTPServer):
    request_queue_size = 256
    daemon_threads = True


def watch_parent(parent):
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.5)


def main():
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--max-response-tokens", type=int, default=100)
    ap.add_argument("--call-timeout", type=float, default=120.0)
    ap.add_argument("--transcripts", default="")
    ap.add_argument("--stream", action="store_true", help="stream every model call (SSE)")
    ARGS = ap.parse_args()
    server = Server((ARGS.host, ARGS.port), Handler)
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
