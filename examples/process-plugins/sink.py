#!/usr/bin/env python3
"""A process plugin sink (standard library only): appends the body of every event, a line
each, to the file `path`, fsyncs, then acknowledges the batch. The agent commits its take only
on that acknowledgement, so a batch this program fails (or dies in the middle of) comes again.

Options (`config:`): `path` (required); `fail_every`: answer an error instead of writing every
Nth batch, to see retries; `received`: a file where every batch received is logged, as
`<id> <first body> <count>`; `delay_ms`: a pause before writing each batch; `pid_file`: where
to write this program's process id.

    sinks:
      out:
        type: process
        channel: durable
        command: [python3, examples/process-plugins/sink.py]
        config: { path: ./var/process-out.txt }
"""

import json
import os
import sys
import time


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def body_of(event):
    if "body" in event:
        return event["body"]
    import base64
    return base64.b64decode(event.get("body_base64", "")).decode("utf-8", "replace")


def main():
    hello = json.loads(sys.stdin.readline())
    assert hello["type"] == "hello" and hello["role"] == "sink", hello
    config = hello.get("config") or {}
    path = config["path"]
    fail_every = int(config.get("fail_every", 0))
    received = config.get("received")
    delay = float(config.get("delay_ms", 0)) / 1000
    if config.get("pid_file"):
        with open(config["pid_file"], "w") as f:
            f.write(str(os.getpid()))
    send({"type": "hello", "protocol": 1})
    batches = 0
    for line in sys.stdin:
        message = json.loads(line)
        if message["type"] == "stop":
            break
        if message["type"] != "batch":
            continue
        batches += 1
        events = message["events"]
        if received:
            with open(received, "a") as log:
                first = body_of(events[0]) if events else ""
                log.write(f"{message['id']} {first} {len(events)}\n")
        if fail_every and batches % fail_every == 0:
            send({"type": "error", "id": message["id"], "message": f"batch {batches} refused on purpose"})
            continue
        if delay:
            time.sleep(delay)
        with open(path, "a") as out:
            for event in events:
                out.write(body_of(event) + "\n")
            out.flush()
            os.fsync(out.fileno())
        send({"type": "ack", "id": message["id"]})


if __name__ == "__main__":
    main()
