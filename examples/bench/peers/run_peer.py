#!/usr/bin/env python3
"""Runs one peer benchmark command and adds Redis-side counters to its result.

    run_peer.py --redis-url redis://127.0.0.1:PORT/ --out results.jsonl --label run=1 -- CMD ARGS...

CMD prints one JSON line (see the peer drivers). Around it, this takes
`INFO commandstats` and `INFO cpu` snapshots of the shared redis-server and adds
`cmds` (commands per job, all of them: those run inside Lua scripts and MULTI
blocks count too; `evalsha_per_job` counts script calls; `scripts_usec_per_job`
the time Redis spent in script calls) and `redis_cpu_s`.
Standard library only (a minimal RESP client).
"""
import json
import socket
import subprocess
import sys
import time
from urllib.parse import urlparse


def info(host, port, section):
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(f"INFO {section}\r\n".encode())
    buf = b""
    while b"\r\n" not in buf:
        buf += s.recv(65536)
    header, rest = buf.split(b"\r\n", 1)
    n = int(header[1:])
    while len(rest) < n + 2:
        rest += s.recv(65536)
    s.close()
    return rest[:n].decode()


def snapshot(host, port):
    cmds = {}
    for line in info(host, port, "commandstats").splitlines():
        if line.startswith("cmdstat_"):
            name, fields = line[len("cmdstat_"):].split(":", 1)
            kv = dict(f.split("=") for f in fields.split(","))
            cmds[name] = int(kv["calls"])
            cmds["usec:" + name] = int(kv["usec"])
    cpu = 0.0
    for line in info(host, port, "cpu").splitlines():
        if line.startswith(("used_cpu_sys:", "used_cpu_user:")):
            cpu += float(line.split(":")[1])
    return cmds, cpu


def main():
    args = sys.argv[1:]
    sep = args.index("--")
    opts = dict(zip(args[:sep:2], args[1:sep:2]))
    cmd = args[sep + 1:]
    url = urlparse(opts["--redis-url"])
    host, port = url.hostname, url.port or 6379
    before, cpu0 = snapshot(host, port)
    t = time.monotonic()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    wall = time.monotonic() - t
    after, cpu1 = snapshot(host, port)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("{")]
    if proc.returncode != 0 or not lines:
        # Record the failure (the suite goes on): the workload's parameters
        # come from the driver's own flags.
        print(f"run_peer: {' '.join(cmd)} failed with {proc.returncode}", file=sys.stderr)
        flags = {a[2:]: b for a, b in zip(cmd, cmd[1:]) if a.startswith("--")}
        mode = next((a for a in cmd[1:] if a in ("enqueue", "process", "e2e")), "?")
        system = "bullmq" if any("bullmq" in a for a in cmd) else "apalis" if any("apalis" in a for a in cmd) else \
            ("rq-fork" if flags.get("worker-class") == "default" else "rq")
        num = lambda k, d: float(flags.get(k, d))
        result = {"workload": "e2e-rate" if mode == "e2e" and num("rate", 0) > 0 else mode, "system": system,
                  "n": int(num("n", 100000)), "producers": int(num("producers", 1)) if mode != "process" else None,
                  "batch": int(num("batch", 1)) if mode != "process" else None, "payload": int(num("payload", 0)),
                  "concurrency": int(num("concurrency", num("workers", 16))) if mode != "enqueue" else None,
                  "rate": num("rate", 0), "jobs_per_s": None, "error": f"exit status {proc.returncode}"}
        if mode == "enqueue":
            result.pop("concurrency")
        if "bb" in cmd[1:]:
            result = {"workload": "bb", "system": system, "scenario": flags.get("scenario"), "n": None,
                      "jobs_per_s": None, "error": f"exit status {proc.returncode}"}
    else:
        result = json.loads(lines[-1])
    n = result.get("n") or 1
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    delta.pop("info", None)
    delta.pop("usec:info", None)
    usec = {k[5:]: v for k, v in delta.items() if k.startswith("usec:")}
    delta = {k: v for k, v in delta.items() if v > 0 and not k.startswith("usec:")}
    scripts = delta.get("evalsha", 0) + delta.get("eval", 0) + delta.get("fcall", 0)
    result["cmds"] = {
        "all_cmds_per_job": round(sum(delta.values()) / n, 3),
        "evalsha_per_job": round(scripts / n, 3),
        "per_command": {k: round(v / n, 3) for k, v in sorted(delta.items()) if v / n >= 0.001},
        # Redis time inside script calls (which includes the commands they
        # run; those are also counted on their own, so they are not added).
        "scripts_usec_per_job": round(sum(usec.get(k, 0) for k in ("evalsha", "eval", "fcall")) / n, 3),
        "note": "whole command run, including any preload",
    }
    result["redis_cpu_s"] = round(cpu1 - cpu0, 3)
    result["command_wall_s"] = round(wall, 3)
    result["label"] = opts.get("--label", "")
    line = json.dumps(result)
    print(line, flush=True)
    if "--out" in opts:
        with open(opts["--out"], "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
