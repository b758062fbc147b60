#!/usr/bin/env python3
"""A process plugin source (standard library only): emits `count` events numbered from 0,
`batch_size` per batch, with the body `<prefix> <n>` and a header `n`.

The position it resumes from is the checkpoint it sends with each batch: the agent stores it
(with the events, in a file channel) and hands it back in the hello of the next start. The
source moves on only after the agent acknowledged a batch; after an error it sends the same
batch again.

    sources:
      numbers:
        type: process
        command: [python3, examples/process-plugins/source.py]
        config: { count: 1000, batch_size: 100, prefix: event }
        channels: [durable]
"""

import json
import sys


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def receive():
    line = sys.stdin.readline()
    if not line:
        sys.exit(0)  # the agent closed our input: stop
    return json.loads(line)


def main():
    hello = receive()
    assert hello["type"] == "hello" and hello["role"] == "source", hello
    config = hello.get("config") or {}
    count = int(config.get("count", 1000))
    batch_size = min(int(config.get("batch_size", 100)), int(hello.get("batch_size", 1000)))
    prefix = config.get("prefix", "event")
    send({"type": "hello", "protocol": 1})
    position = int(hello.get("checkpoint") or 0)
    batch_id = 0
    while position < count:
        end = min(position + batch_size, count)
        batch_id += 1
        events = [{"headers": {"n": str(n)}, "body": f"{prefix} {n}"} for n in range(position, end)]
        send({"type": "batch", "id": batch_id, "events": events, "checkpoint": str(end)})
        while True:
            answer = receive()
            if answer["type"] == "stop":
                return
            if answer["type"] == "durable":
                # With a memory channel: the events up to this checkpoint were delivered.
                # Something to tell upstream, if the program had one; nothing to do here.
                continue
            if answer["type"] == "ack" and answer.get("id") == batch_id:
                position = end  # committed: move on
            else:
                print(f"batch {batch_id} not committed: {answer}", file=sys.stderr)
            break


if __name__ == "__main__":
    main()
