#!/usr/bin/env python3
"""A small reward/verifier HTTP server for the envs tests (Python stdlib only).

Start: reward_server.py [--host 127.0.0.1] [--port 0]
It prints "PORT <n>" on stdout once it listens, then serves until killed.
It exits by itself when its parent process goes away (no orphans).

POST bodies are the RewardClient's JSON sample:
  {"task", "prompt", "response", "reference", "metadata": {...}}

Behaviour is chosen by path (a verifier service is a path ending in /verify):
  /verify, /<name>/verify   ok: reward = metadata["reward"] if given, else
                             1.0 if response.strip() == reference.strip() else 0.0
  /r/<value>/verify         ok with reward <value> (routing tests)
  /slow/<seconds>/verify    sleeps, then ok
  /status/<code>/verify     answers with that HTTP status
  /malformed/verify         200 with a body that is not JSON
  /noreward/verify          200 with JSON lacking "reward"
  /nan/verify               200 with {"reward": NaN}
  /huge/verify              200 with a 1 MiB body
  /close/verify             closes the connection without answering
  /flaky/<n>/verify         503 for the first <n> requests of each metadata["key"], then ok
GET /stats                  {"paths": {path: count}, "max_inflight": n}
A query string (/status/500/verify?case=7) does not change the behaviour but
is counted as its own path, so tests can count the requests of one case.
"""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
COUNTS = {}
FLAKY = {}
INFLIGHT = [0, 0]  # now, max


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without TCP_NODELAY, Nagle
    # plus the client's delayed ACK would add ~40 ms to every answer.
    disable_nagle_algorithm = True

    def log_message(self, fmt, *args):  # keep test output quiet
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/stats":
            with LOCK:
                self._send(200, json.dumps({"paths": COUNTS, "max_inflight": INFLIGHT[1]}))
        else:
            self._send(404, '{"error": "not found"}')

    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        path = self.path
        with LOCK:
            COUNTS[path] = COUNTS.get(path, 0) + 1
            INFLIGHT[0] += 1
            INFLIGHT[1] = max(INFLIGHT[1], INFLIGHT[0])
        try:
            self._handle(path, raw)
        finally:
            with LOCK:
                INFLIGHT[0] -= 1

    def _ok(self, sample, reward=None):
        meta = sample.get("metadata") or {}
        if reward is None:
            if isinstance(meta, dict) and isinstance(meta.get("reward"), (int, float)):
                reward = float(meta["reward"])
            else:
                same = sample.get("response", "").strip() == sample.get("reference", "").strip()
                reward = 1.0 if same else 0.0
        self._send(200, json.dumps({"reward": reward, "components": {"exact": reward}}))

    def _handle(self, path, raw):
        try:
            sample = json.loads(raw or b"{}")
        except ValueError:
            self._send(400, '{"error": "request is not JSON"}')
            return
        parts = [p for p in path.split("?")[0].split("/") if p]
        if not parts or parts[-1] != "verify":
            self._send(404, '{"error": "unknown path"}')
            return
        kind = parts[0] if len(parts) > 1 else "verify"
        if kind == "r":
            self._ok(sample, float(parts[1]))
        elif kind == "slow":
            time.sleep(float(parts[1]))
            self._ok(sample)
        elif kind == "status":
            self._send(int(parts[1]), '{"error": "as requested"}')
        elif kind == "malformed":
            self._send(200, "{not json")
        elif kind == "noreward":
            self._send(200, '{"score": 1}')
        elif kind == "nan":
            self._send(200, '{"reward": NaN}')
        elif kind == "huge":
            self._send(200, '{"reward": 1, "pad": "' + "x" * (1 << 20) + '"}')
        elif kind == "close":
            self.close_connection = True
            self.connection.shutdown(2)
        elif kind == "flaky":
            key = (sample.get("metadata") or {}).get("key", "")
            with LOCK:
                seen = FLAKY.get(key, 0)
                FLAKY[key] = seen + 1
            if seen < int(parts[1]):
                self._send(503, '{"error": "try again"}')
            else:
                self._ok(sample)
        else:
            self._ok(sample)


class Server(ThreadingHTTPServer):
    # socketserver's default listen backlog is 5: tests open dozens of
    # connections at once, and on a loaded machine the dropped SYNs stalled
    # clients for seconds (kernel SYN retries) until their deadlines passed.
    request_queue_size = 256
    daemon_threads = True


def watch_parent(parent):
    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args()
    server = Server((args.host, args.port), Handler)
    threading.Thread(target=watch_parent, args=(os.getppid(),), daemon=True).start()
    print("PORT %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
