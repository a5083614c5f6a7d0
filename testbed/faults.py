"""WAN faults on a schedule, for tests and the soak benchmark: delay and jitter, packet loss, link cuts, switch
kill and restart, a whole cluster killed and launched again.

The kernel here has no `netem`, so delay and jitter come from a small user-space proxy (`DelayProxy`, run as
`python -m testbed.faults proxy ...` inside a site's namespace): each switch dials its peers through a
proxy on its own site's loopback, which forwards over the WAN and holds every chunk, each way, for
`delay_ms` +- `jitter_ms` (uniform, in order: a TCP stream is never reordered, so a chunk leaves no earlier than the
one before it). Loss (nftables), rate (tbf) and link down/up are the kernel's, through `testbed.netns.Sites`.

`FaultyWan` puts it together: sites in namespaces, one switch per site (`testbed.federation`), the peers
reached through the proxies. `Schedule` runs timed actions in a thread and keeps a log of what it did and when.
"""
from __future__ import annotations

__all__ = ["DelayProxy", "FaultyWan", "Schedule", "periodic"]

import argparse
import asyncio
import random
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

MAX_HELD = 4 * 1024 * 1024  # bytes a direction holds in flight before it stops reading (the socket pushes back)


@dataclass
class DelayProxy:
    """Forward TCP connections from `listen` (host, port) to `target`, delaying each direction by `delay_ms` +-
    `jitter_ms`."""

    listen: tuple[str, int]
    target: tuple[str, int]
    delay_ms: float
    jitter_ms: float = 0.0
    seed: int = 0
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        if self.delay_ms < 0 or not 0 <= self.jitter_ms <= self.delay_ms:
            raise ValueError(f"delay_ms={self.delay_ms} must be >= 0 and jitter_ms={self.jitter_ms} in [0, delay_ms]")
        self.rng = random.Random(self.seed)

    def _due(self, last: float) -> float:
        jitter = self.rng.uniform(-self.jitter_ms, self.jitter_ms) if self.jitter_ms else 0.0
        return max(last, time.monotonic() + (self.delay_ms + jitter) / 1000.0)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line: asyncio.Queue = asyncio.Queue()
        held = [0]
        room = asyncio.Event()
        room.set()

        async def read() -> None:
            last = 0.0
            while data := await reader.read(65536):
                last = self._due(last)
                held[0] += len(data)
                await line.put((last, data))
                if held[0] > MAX_HELD:
                    room.clear()
                    await room.wait()
            await line.put((self._due(last), b""))

        async def write() -> None:
            while True:
                due, data = await line.get()
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
                held[0] -= len(data)
                if held[0] <= MAX_HELD:
                    room.set()

        reading = asyncio.ensure_future(read())
        try:
            await write()
        finally:
            reading.cancel()

    async def _serve_one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for w in (writer, up_w):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        tasks = [asyncio.ensure_future(self._pipe(reader, up_w)), asyncio.ensure_future(self._pipe(up_r, writer))]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                t.cancel()
            for w in (writer, up_w):
                w.close()


def _proxy_main(argv: Sequence[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m testbed.faults proxy")
    ap.add_argument("--route", action="append", required=True, help="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    ap.add_argument("--delay-ms", type=float, required=True)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    def addr(s: str) -> tuple[str, int]:
        host, _, port = s.rpartition(":")
        return host, int(port)

    async def main() -> None:
        proxies = [DelayProxy(addr(a), addr(b), args.delay_ms, args.jitter_ms, args.seed + i)
                   for i, (a, b) in enumerate(r.split("=", 1) for r in args.route)]
        servers = [await asyncio.start_server(p._serve_one, *p.listen) for p in proxies]
        print("proxying", flush=True)
        await asyncio.gather(*(s.serve_forever() for s in servers))

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FaultyWan:
    """Sites `clusters` in namespaces, each with its switch (provisioned under `root`), linked through delay
    proxies; loss, rate and cuts through `sites`. `procs` starts (and reaps) every process. With
    `namespaces=False` (no root) the switches run on loopback: delay, jitter and switch restarts only."""

    def __init__(self, root: Path, clusters: Sequence[str], procs: Any, *, delay_ms: float = 0.0,
                 jitter_ms: float = 0.0, loss_per_mille: int = 0, rate_mbit: float | None = None,
                 name: str = "faultwan", seed: int = 0, namespaces: bool = True) -> None:
        from testbed.federation import LocalFederation
        from testbed.netns import Sites

        if not namespaces and (loss_per_mille or rate_mbit is not None):
            raise ValueError(f"loss_per_mille={loss_per_mille} and rate_mbit={rate_mbit} are the kernel's: they need "
                             "network namespaces (root); leave them out with namespaces=False")
        self.clusters, self.procs = list(clusters), procs
        self.sites = Sites(self.clusters, rate_mbit=rate_mbit, prefix=name[:8]) if namespaces else None
        self.proxies: dict[str, Any] = {}
        try:
            routes: dict[str, list[str]] = {c: [] for c in self.clusters}

            def via_proxy(cluster: str, doc: dict) -> None:
                if not delay_ms:
                    return
                peers = []
                for p in doc["peers"]:
                    port = free_port()  # (in the host's namespace; the site's loopback has the same ports free)
                    routes[cluster].append(f"127.0.0.1:{port}={p['address']}")
                    peers.append({**p, "address": f"127.0.0.1:{port}"})
                doc["peers"] = peers

            self.fed = LocalFederation(root, self.clusters, procs=procs, sites=self.sites, edit=via_proxy,
                                       name=name, start=False)
            if delay_ms:
                for i, c in enumerate(self.clusters):
                    self.proxies[c] = self._proxy(c, routes[c], delay_ms, jitter_ms, seed + i)
            for c in self.clusters:
                self.fed.start(c)
            if loss_per_mille:
                for c in self.clusters:
                    self.sites.set_loss(c, loss_per_mille)
        except BaseException:
            self.close()
            raise

    def _proxy(self, cluster: str, routes: list[str], delay_ms: float, jitter_ms: float, seed: int) -> Any:
        args = [sys.executable, "-m", "testbed.faults", "proxy", "--delay-ms", str(delay_ms), "--jitter-ms",
                str(jitter_ms), "--seed", str(seed)]
        for r in routes:
            args += ["--route", r]
        p = self.procs.start([*self.fed.prefix(cluster), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        line = p.stdout.readline()
        if "proxying" not in line:
            raise RuntimeError(f"delay proxy of site {cluster} did not start: {line}{p.stdout.read()[-2000:]}")
        threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()
        return p

    # ---- faults ----
    def cut(self, cluster: str, seconds: float) -> None:
        """Take the site off the WAN for `seconds` (blocks; needs namespaces)."""
        if self.sites is None:
            raise RuntimeError("link cuts need network namespaces (root): this WAN runs on loopback")
        self.sites.link_down(cluster)
        try:
            time.sleep(seconds)
        finally:
            self.sites.link_up(cluster)

    def restart_switch(self, cluster: str, down_s: float = 1.0) -> None:
        """Kill the site's switch (SIGKILL) and start it again after `down_s`."""
        self.fed.switches[cluster].kill9()
        time.sleep(down_s)
        self.fed.start(cluster)

    def prefix(self, cluster: str) -> tuple[str, ...]:
        """What runs a command inside the site."""
        return self.fed.prefix(cluster)

    def workers(self) -> dict[str, Path]:
        return self.fed.workers

    def close(self) -> None:
        fed = getattr(self, "fed", None)
        if fed is not None:
            fed.close()
        for p in self.proxies.values():
            self.procs.stop(p)
        if self.sites is not None:
            self.sites.close()


class Schedule:
    """Timed actions in a background thread: `at(t, name, fn)` runs `fn` `t` seconds after `start()`; `log` holds
    (name, start, end, error) of each, in seconds since the start."""

    def __init__(self) -> None:
        self.events: list[tuple[float, str, Callable[[], Any]]] = []
        self.log: list[dict] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.t0 = 0.0

    def at(self, t: float, name: str, fn: Callable[[], Any]) -> Schedule:
        self.events.append((t, name, fn))
        return self

    def start(self) -> Schedule:
        self.t0 = time.monotonic()
        for t, name, fn in sorted(self.events, key=lambda e: e[0]):
            th = threading.Thread(target=self._run, args=(t, name, fn), name=f"fault-{name}", daemon=True)
            th.start()
            self._threads.append(th)
        return self

    def _run(self, t: float, name: str, fn: Callable[[], Any]) -> None:
        if self._stop.wait(max(0.0, self.t0 + t - time.monotonic())):
            return
        start = time.monotonic() - self.t0
        err = None
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - recorded; a fault that failed is part of the report
            err = f"{type(exc).__name__}: {exc}"
        self.log.append({"name": name, "start": round(start, 2), "end": round(time.monotonic() - self.t0, 2),
                         "error": err})

    def stop(self) -> None:
        """Cancel what has not run yet and wait (briefly) for what runs."""
        self._stop.set()
        for th in self._threads:
            th.join(timeout=30)


def periodic(every_s: float, until_s: float, first_s: float | None = None) -> list[float]:
    """Times `first_s`, `first_s + every_s`, ... before `until_s` (first: `every_s`)."""
    t, out = every_s if first_s is None else first_s, []
    while t < until_s:
        out.append(t)
        t += every_s
    return out


if __name__ == "__main__":
    if sys.argv[1:2] != ["proxy"]:
        sys.exit("usage: python -m testbed.faults proxy --route L=T [--route ...] --delay-ms D [--jitter-ms J]")
    _proxy_main(sys.argv[2:])
