"""Enqueue a job for a Rust queue-core worker from Python (redis-py + msgpack).

The wire format is described in docs/PROTOCOL.md. In short: the job is written
by one Lua script (the queue-core prelude followed by enqueue.lua) with eight
keys that share the hash tag ``{queue}``, and the payload is the MessagePack
of the handler's argument type (structs as maps keyed by field name, enums
externally tagged: ``"Unit"`` or ``{"Variant": value}``, ``None`` as nil).

Use it as a module::

    import redis, enqueue
    r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    producer = enqueue.Producer(r, enqueue.load_script())
    outcome = producer.enqueue("emails", "send_welcome", {"email": "a@example.com"},
                               job_id="signup-42")
    print(outcome)  # ('created', 'signup-42'), ('duplicate', id, state) or ('already-completed', id)

or from the command line (the same flags as ``queue-watchdog enqueue``)::

    python enqueue.py --redis URL -q emails --type send_welcome --json '{"email": "a@example.com"}'
"""

import argparse
import json
import os
import sys
import uuid

import msgpack
import redis

HERE = os.path.dirname(os.path.abspath(__file__))
# Copy prelude.lua and enqueue.lua next to your producer, or point QUEUE_SCRIPTS_DIR at them.
DEFAULT_SCRIPTS_DIR = os.path.join(HERE, "..", "..", "..", "queue-core", "src", "scripts")


def load_script(scripts_dir=None):
    """The enqueue script exactly as queue-core sends it: prelude, a newline, enqueue.lua."""
    scripts_dir = scripts_dir or os.environ.get("QUEUE_SCRIPTS_DIR") or DEFAULT_SCRIPTS_DIR
    with open(os.path.join(scripts_dir, "prelude.lua"), encoding="utf-8") as f:
        prelude = f.read()
    with open(os.path.join(scripts_dir, "enqueue.lua"), encoding="utf-8") as f:
        body = f.read()
    return prelude + "\n" + body


def queue_keys(queue, job_id):
    """KEYS of enqueue.lua, in order (the QueueKeys layout)."""
    base = "q:{%s}:" % queue
    return [
        base + "main",
        base + "job:" + job_id,
        base + "done:" + job_id,
        base + "delayed",
        base + "stats",
        base + "once:" + job_id,
        base + "wake",
        base + "guard",  # never written: see docs/PROTOCOL.md, section 2
    ]


def check_id(job_id):
    """The id rules queue-core enforces: 1..512 bytes of UTF-8, no control characters."""
    size = len(job_id.encode("utf-8"))
    if size == 0 or size > 512:
        raise ValueError("job id must be 1 to 512 bytes, got %d" % size)
    if any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in job_id):
        raise ValueError("job id must not contain control characters")


class Producer:
    """Enqueues jobs through queue-core's enqueue script (EVALSHA, loaded on NOSCRIPT)."""

    def __init__(self, client, script_text):
        self._script = client.register_script(script_text)

    @property
    def sha(self):
        return self._script.sha

    def enqueue(self, queue, job_type, args, job_id=None, delay_ms=0, run_at_ms=0,
                max_attempts=25, schema_version=1):
        """Writes one job. Returns ('created', id), ('duplicate', id, state) or
        ('already-completed', id). Raises on any Redis error: an enqueue only
        succeeded when this returns (retry with the same job_id to make a retry a no-op)."""
        job_id = job_id if job_id is not None else str(uuid.uuid4())
        check_id(job_id)
        payload = msgpack.packb(args, use_bin_type=True)
        reply = self._script(
            keys=queue_keys(queue, job_id),
            args=[job_id, job_type, int(schema_version), payload, max(1, int(max_attempts)),
                  int(delay_ms), int(run_at_ms), 0],
        )
        tag = reply[0].decode() if isinstance(reply[0], bytes) else reply[0]
        if tag == "new":
            return ("created", job_id)
        if tag == "exists":
            state = reply[1].decode() if isinstance(reply[1], bytes) else reply[1]
            return ("duplicate", job_id, state)
        if tag == "done":
            return ("already-completed", job_id)
        raise RuntimeError("queue %r, job %r: unknown enqueue reply %r" % (queue, job_id, reply))


def main(argv):
    p = argparse.ArgumentParser(description="Enqueue one job for a queue-core worker.")
    p.add_argument("--redis", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/"))
    p.add_argument("-q", "--queue", required=True)
    p.add_argument("--type", dest="job_type", required=True)
    p.add_argument("--json", required=True, help="the job's arguments as JSON, '-' for stdin")
    p.add_argument("--id")
    p.add_argument("--delay-ms", type=int, default=0)
    p.add_argument("--run-at-ms", type=int, default=0, help="Unix milliseconds (Redis clock)")
    p.add_argument("--max-attempts", type=int, default=25)
    p.add_argument("--schema-version", type=int, default=1)
    p.add_argument("--print-sha", action="store_true", help="print the script's SHA1 and exit")
    a = p.parse_args(argv)
    client = redis.Redis.from_url(a.redis)
    producer = Producer(client, load_script())
    if a.print_sha:
        print(producer.sha)
        return 0
    text = sys.stdin.read() if a.json == "-" else a.json
    outcome = producer.enqueue(a.queue, a.job_type, json.loads(text), job_id=a.id,
                               delay_ms=a.delay_ms, run_at_ms=a.run_at_ms,
                               max_attempts=a.max_attempts, schema_version=a.schema_version)
    if outcome[0] == "duplicate":
        print("duplicate %s state=%s" % (outcome[1], outcome[2]))
    else:
        print("%s %s" % outcome)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
