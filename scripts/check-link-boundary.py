#!/usr/bin/env python3
"""Fails when the actor host binary holds code of the launcher's head side.

troupe-actor links troupe::job (the job schema) and must not pull in the head,
the spawners, subprocess handling or the accounting (launcher/src/*). Reads the
binary's defined symbols with nm (binutils) and names each offending one.
Usage: check-link-boundary.py BINARY
"""
import re
import subprocess
import sys

# Classes and functions of troupe::launcher that only the head side defines.
FORBIDDEN = re.compile(
    r"troupe::launcher::(Head\b|Head::|\w*Spawner\b|\w*Spawner::|Subprocess\b|Subprocess::|"
    r"SumAccounting|ControlClient|SendControl|Dashboard\b|Dashboard::|Telemetry\b|Telemetry::|"
    r"Prometheus\w*\b|TensorBoard\w*\b|remote::)")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    binary = sys.argv[1]
    out = subprocess.run(["nm", "-C", "--defined-only", binary], check=True,
                         capture_output=True, text=True).stdout
    symbols = [line.split(" ", 2)[-1] for line in out.splitlines() if " " in line]
    job = [s for s in symbols if "troupe::launcher::" in s]
    bad = sorted({s for s in symbols if FORBIDDEN.search(s)})
    print(f"{binary}: {len(symbols)} symbols, {len(job)} of the job schema (troupe::launcher)")
    if not job:
        sys.exit("no job-schema symbol found: is this troupe-actor, built with symbols?")
    if bad:
        print(f"{len(bad)} symbol(s) of the launcher's head side:")
        for s in bad[:40]:
            print("  " + s)
        sys.exit(1)
    print("ok: no head, spawner, subprocess, control-client or telemetry code")


if __name__ == "__main__":
    main()
