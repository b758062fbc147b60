#!/usr/bin/env python3
"""Hostile and broken Kafka clients against a broker, from a process of their own, while a
well-behaved one keeps asking: the load of the broker's limit tests and of the hostile soak.

    hostile_clients.py ADDRESS MODE [--count N] [--seconds S] [--tls-ca FILE] [options]

Modes (each connection opened once, kept until the broker closes it or the run ends):
    hogs       each connection announces a request of --announce bytes and sends --send bytes
               of it (an ApiVersions header), then nothing
    trickle    each connection sends a small request one byte every --every seconds
    oversized  each connection announces --announce bytes, as a client before SASL
               authentication would, and sends --send bytes of it
    tls-stall  each connection opens TCP to a TLS listener and sends --send bytes of a TLS
               record header, never finishing the handshake (the probe uses TLS: --tls-ca)
    sasl-stall each connection sends a SaslHandshake (PLAIN), reads the answer, and never
               authenticates
    flood      connections opened and closed as fast as they go, each sending a broken frame
    frames     connections each sending requests mutated from a corpus of real clients'
               requests (--corpus, one frame per file: fuzz/corpus/kafka_request), some with
               a wrong size, reading whatever comes back, for the whole run

Meanwhile a probe opens a fresh connection every --probe-every seconds and sends ApiVersions,
timing the answer. At the end one JSON object is printed: the probes (answered, failed, the
slowest in seconds), and for each hostile connection how long after its first byte the broker
closed it (null when it stayed open to the end).
"""

import argparse
import asyncio
import json
import os
import random
import ssl
import struct
import sys
import threading
import time


def api_versions(correlation_id: int) -> bytes:
    """An ApiVersions v0 request frame (header v1, client id "probe")."""
    client_id = b"probe"
    body = struct.pack(">hhih", 18, 0, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


async def connect(host: str, port: int, tls: ssl.SSLContext | None):
    return await asyncio.open_connection(
        host, port, ssl=tls, server_hostname="localhost" if tls else None
    )


async def closed_after(reader: asyncio.StreamReader, started: float, until: float):
    """Seconds from `started` to the broker closing the connection; None if open at `until`."""
    try:
        while True:
            left = until - time.monotonic()
            if left <= 0:
                return None
            data = await asyncio.wait_for(reader.read(65536), timeout=left)
            if not data:
                return time.monotonic() - started
    except asyncio.TimeoutError:
        return None
    except (ConnectionError, OSError):
        return time.monotonic() - started


async def hog(args, tls, until) -> float | None:
    reader, writer = await connect(args.host, args.port, tls)
    started = time.monotonic()
    header = struct.pack(">hhi", 18, 0, 1)
    writer.write(struct.pack(">i", args.announce) + header[: args.send])
    try:
        await writer.drain()
    except (ConnectionError, OSError):
        return time.monotonic() - started
    result = await closed_after(reader, started, until)
    writer.close()
    return result


async def tls_stall(args, tls, until) -> float | None:
    reader, writer = await connect(args.host, args.port, None)
    started = time.monotonic()
    # A TLS handshake record's header, cut short: content type 22, version 3.1, a length.
    writer.write(b"\x16\x03\x01\x02\x00"[: args.send])
    try:
        await writer.drain()
    except (ConnectionError, OSError):
        return time.monotonic() - started
    result = await closed_after(reader, started, until)
    writer.close()
    return result


async def sasl_stall(args, tls, until) -> float | None:
    reader, writer = await connect(args.host, args.port, tls)
    started = time.monotonic()
    mechanism, client_id = b"PLAIN", b"stall"
    body = struct.pack(">hhih", 17, 1, 1, len(client_id)) + client_id
    body += struct.pack(">h", len(mechanism)) + mechanism
    writer.write(struct.pack(">i", len(body)) + body)
    try:
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        answer = await reader.readexactly(size)
        if struct.unpack(">h", answer[4:6])[0] != 0:
            raise ValueError("SaslHandshake refused")
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
        return time.monotonic() - started
    result = await closed_after(reader, started, until)
    writer.close()
    return result


async def trickle(args, tls, until) -> float | None:
    reader, writer = await connect(args.host, args.port, tls)
    started = time.monotonic()
    request = api_versions(1)
    closed = asyncio.ensure_future(closed_after(reader, started, until))
    for i in range(len(request)):
        if closed.done():
            break
        writer.write(request[i : i + 1])
        try:
            await writer.drain()
        except (ConnectionError, OSError):
            break
        try:
            await asyncio.wait_for(asyncio.shield(closed), timeout=args.every)
        except asyncio.TimeoutError:
            pass
    result = await closed
    writer.close()
    return result


async def connections(args, tls, until):
    """Fresh connections, one after another until `until` (the caller closes each); a refused
    one is tried again a moment later."""
    while time.monotonic() < until:
        try:
            yield await connect(args.host, args.port, tls)
        except (ConnectionError, OSError):
            await asyncio.sleep(0.01)


async def flood(args, tls, until) -> int:
    """Connections opened, given a broken frame and dropped until `until`; returns how many."""
    opened = 0
    async for reader, writer in connections(args, tls, until):
        opened += 1
        writer.write(struct.pack(">i", 12) + b"\xff\xff\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00")
        try:
            await writer.drain()
            await asyncio.wait_for(reader.read(1), timeout=1)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass
        writer.close()
    return opened


def mutated(frames: list[bytes], rng: random.Random) -> bytes:
    """A frame of the corpus with a few bytes changed, cut or added, size-prefixed (now and
    then with a size that is not its own)."""
    frame = bytearray(rng.choice(frames))
    for _ in range(rng.randint(1, 4)):
        kind = rng.random()
        if kind < 0.6 and frame:
            frame[rng.randrange(len(frame))] = rng.randrange(256)
        elif kind < 0.8 and frame:
            del frame[rng.randrange(len(frame)) :]
        else:
            frame += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    size = len(frame)
    if rng.random() < 0.05:
        size = rng.choice([0, 1, 7, size + 1, size + 1000, 2**31 - 1, -1])
    return struct.pack(">i", size) + bytes(frame)


async def frames(args, tls, until, rng: random.Random) -> int:
    """Mutated requests on connection after connection until `until`; returns how many."""
    corpus = [open(os.path.join(args.corpus, f), "rb").read() for f in sorted(os.listdir(args.corpus))]
    sent = 0
    async for reader, writer in connections(args, tls, until):
        try:
            for _ in range(rng.randint(1, 20)):
                writer.write(mutated(corpus, rng))
                await writer.drain()
                sent += 1
                # A response, a close, or nothing (a frame the broker still waits on).
                await asyncio.wait_for(reader.read(65536), timeout=0.2)
        except (asyncio.TimeoutError, ConnectionError, OSError, asyncio.IncompleteReadError):
            pass
        writer.close()
    return sent


async def probe(args, tls, until, started: threading.Event) -> dict:
    # Nothing else runs on this thread's loop: waiting here blocks no hostile connection.
    started.wait(timeout=max(0.0, until - time.monotonic()))
    answered, failed, slowest, correlation_id = 0, 0, 0.0, 0
    errors = []
    while time.monotonic() < until:
        correlation_id += 1
        began = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(connect(args.host, args.port, tls), timeout=5)
            writer.write(api_versions(correlation_id))
            await writer.drain()
            size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout=5))[0]
            body = await asyncio.wait_for(reader.readexactly(size), timeout=5)
            writer.close()
            if struct.unpack(">i", body[:4])[0] != correlation_id:
                raise ValueError("wrong correlation id")
            answered += 1
            slowest = max(slowest, time.monotonic() - began)
        except Exception as e:  # noqa: BLE001 - every failure is counted and named
            failed += 1
            slowest = max(slowest, time.monotonic() - began)
            if len(errors) < 5:
                errors.append(f"{type(e).__name__}: {e}")
        await asyncio.sleep(max(0.0, args.probe_every - (time.monotonic() - began)))
    return {"answered": answered, "failed": failed, "slowest": slowest, "errors": errors}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("address")
    parser.add_argument(
        "mode",
        choices=["hogs", "trickle", "oversized", "tls-stall", "sasl-stall", "flood", "frames"],
    )
    parser.add_argument("--corpus", help="frames: the directory of request frames")
    parser.add_argument("--seed", type=int, default=1, help="frames: the random seed")
    parser.add_argument("--count", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the run lasts")
    parser.add_argument("--announce", type=int, default=104_857_000)
    parser.add_argument("--send", type=int, default=4)
    parser.add_argument("--every", type=float, default=2.0)
    parser.add_argument("--probe-every", type=float, default=0.2)
    parser.add_argument("--tls-ca", help="connect over TLS, trusting this CA (PEM)")
    parser.add_argument(
        "--repeat",
        action="store_true",
        help="hogs, trickle, oversized: open the connection again each time the broker "
        "closes it, to the end of the run (the report keeps the first close)",
    )
    args = parser.parse_args()
    args.host, port = args.address.rsplit(":", 1)
    args.port = int(port)
    tls = None
    if args.tls_ca:
        tls = ssl.create_default_context(cafile=args.tls_ca)

    until = time.monotonic() + args.seconds
    # The probe runs on a thread with an event loop of its own, so that it times the broker's
    # answer rather than how long this loop, busy with the hostile connections, took to come
    # back to it (the threads take turns holding the interpreter every few milliseconds).
    started = threading.Event()
    probing = asyncio.get_running_loop().run_in_executor(
        None, lambda: asyncio.run(probe(args, tls, until, started))
    )
    report = {"mode": args.mode}
    if args.mode == "flood":
        started.set()
        floods = await asyncio.gather(*(flood(args, tls, until) for _ in range(args.count)))
        report["connections"] = sum(floods)
    elif args.mode == "frames":
        started.set()
        rngs = [random.Random(args.seed * 1000 + i) for i in range(args.count)]
        sent = await asyncio.gather(*(frames(args, tls, until, rng) for rng in rngs))
        report["frames"] = sum(sent)
    else:
        once = {
            "hogs": hog,
            "oversized": hog,
            "trickle": trickle,
            "tls-stall": tls_stall,
            "sasl-stall": sasl_stall,
        }[args.mode]

        async def one(args, tls, until):
            first = await once(args, tls, until)
            while args.repeat and time.monotonic() < until - 0.5:
                try:
                    await once(args, tls, until)
                except (ConnectionError, OSError):
                    await asyncio.sleep(0.1)
            return first

        tasks = []
        # Opened a few at a time, so that the broker's accept queue never overflows.
        for i in range(args.count):
            tasks.append(asyncio.ensure_future(one(args, tls, until)))
            if i % 50 == 49:
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        started.set()
        closed = await asyncio.gather(*tasks, return_exceptions=True)
        report["closed_after"] = [None if isinstance(c, BaseException) or c is None else round(c, 3) for c in closed]
        report["errors"] = sorted({f"{type(c).__name__}: {c}" for c in closed if isinstance(c, BaseException)})[:5]
    report["probe"] = await probing
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
