"""Run a README section as printed, each site in its own network namespace and directory, only kits shipped between.

A section's ```yaml block whose first line is `# NAME: ...` is written to the admin's directory as NAME. In a
```bash block, a comment line says where the commands below it run: `# admin` (the admin's directory, no
network), `# on A` (site A: its namespace, its directory), with `(B and C likewise)` for the same commands run on
those sites too, the site's name substituted. A command ending in `&` runs in the background: a `start` script or
`nebula-switch serve` is waited for until it listens, anything else must have exited 0 by the end of its block.
A header's `with X, Y and Z shipped there` copies those paths from the admin's directory to the site before its
commands run (an archive `A.tar.gz` or `A-r2.tar.gz` from the admin's `fed/kits` or `fed/updates`): the only files
that cross between hosts. The admin's and every site's directory get `recipes` (the checkout's), as a Nebula
checkout there would have. Commands run as the README tells a user to, with the environment's bin
directory first on PATH (what activating it does).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Sequence

from testbed.netns import Sites
from testbed.procs import BIN, REPO, Procs

__all__ = ["SiteRunner", "blocks", "section"]

_HEADER = re.compile(r"^# (admin|on (\w+))\b(.*)$")
_LIKEWISE = re.compile(r"\(([\w, ]+?) likewise\)")
_SHIP = re.compile(r"with (.+?) shipped there")
_AND = re.compile(r",\s*|\s+and\s+")


def section(path: Path, title: str) -> str:
    """The text of section `title` (a `## ` heading) of markdown file `path`, up to the next heading of its level."""
    text = path.read_text(encoding="utf-8")
    start = text.index(title)
    level = title.split(" ")[0]
    end = text.find(f"\n{level} ", start + len(title))
    return text[start:] if end < 0 else text[start:end]


def blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of every fenced block of `text`, in order."""
    return re.findall(r"```(\w+)\n(.*?)```", text, re.S)


def _rename(text: str, cluster: str, other: str) -> str:
    """`text` about cluster `other` instead of `cluster`: its name replaced wherever it stands alone (`fed/A/`,
    `A.tar.gz`, `launch_A.sh`, `A-r2`)."""
    return re.sub(rf"(?<![A-Za-z0-9]){cluster}(?![A-Za-z0-9])", other, text)


def _strip_comment(line: str) -> str:
    """`line` without its trailing shell comment (a `#` after a blank, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].strip()
    return line.strip()


class SiteRunner:
    """An admin directory and one directory and namespace per site, under `root`; `sites` places the namespaces."""

    def __init__(self, procs: Procs, root: Path, sites: Sites, env: dict[str, str] | None = None) -> None:
        self.procs, self.root, self.sites = procs, Path(root), sites
        self.admin = self.root / "admin"
        self.admin.mkdir(parents=True, exist_ok=True)
        (self.admin / "recipes").symlink_to(REPO / "recipes")
        self.env = {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(REPO), **(env or {})}
        self.servers: dict[str, list[subprocess.Popen]] = {}
        self.background: list[tuple[str, str, subprocess.Popen, Path]] = []
        self.logs = self.root / "logs"
        self.logs.mkdir(exist_ok=True)
        self.ran: list[tuple[str, str]] = []  # (where, command) of every command, in order
        self.stdout: dict[int, str] = {}  # what each foreground command printed, by its index in `ran` (from 1)

    # ---- places ----
    def site_dir(self, cluster: str) -> Path:
        """Site `cluster`'s directory (made, with its namespace, when first used)."""
        d = self.root / f"site-{cluster}"
        if cluster not in self.sites.namespaces:
            self.sites.add(cluster, self._address(cluster))
        if not d.exists():
            d.mkdir()
            (d / "recipes").symlink_to(REPO / "recipes")
        return d

    def _address(self, cluster: str) -> str | None:
        """The cluster's host as the admin provisioned it (for a site added after the namespaces were made)."""
        spec = self.admin / "fed" / "federation.yaml"
        if spec.exists():
            import yaml

            for c in yaml.safe_load(spec.read_text())["clusters"]:
                if c["name"] == cluster:
                    return c["host"]
        return None

    def ship(self, name: str, cluster: str) -> None:
        """Copy `name` from the admin to the site (as a courier would): an archive from the admin's fed/kits or
        fed/updates, any other path from the admin's directory to the same place in the site's."""
        dest = self.site_dir(cluster) / name
        for src in (self.admin / "fed" / "kits" / name, self.admin / "fed" / "updates" / name, self.admin / name):
            if src.is_dir():
                shutil.copytree(src, dest, dirs_exist_ok=True)
                return
            if src.is_file():
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest)
                return
        raise AssertionError(f"{name} is nothing the admin has to ship: {self.ran[-3:]}")

    # ---- running ----
    def run_block(self, code: str, timeout_s: float = 300.0) -> None:
        """Run every command of a bash block where its headers say; background jobs other than servers must have
        ended (exit 0) by the block's end."""
        self._targets: tuple[str | None, list[str], bool] = (None, [], True)
        for raw in code.splitlines():
            line = raw.strip()
            if not line:
                continue
            m = _HEADER.match(line)
            if m:
                likewise, ship = _LIKEWISE.search(m.group(3)), _SHIP.search(m.group(3))
                others = _AND.split(likewise.group(1)) if likewise else []
                self._targets = (m.group(2), others, m.group(1) == "admin")
                for site in [m.group(2), *others] if m.group(2) and ship else []:
                    for name in _AND.split(ship.group(1)):
                        self.ship(_rename(name, m.group(2), site), site)
                continue
            if line.startswith("#"):
                continue
            self._command(line, timeout_s)
        self.wait_background(timeout_s)

    def _command(self, line: str, timeout_s: float) -> None:
        primary, others, admin = self._targets
        names = self._names(line)
        first = primary or next(iter(names), None)
        runs = [(primary or "admin", line)]
        for other in others:
            runs.append((other if not admin else "admin", _rename(line, first, other) if first else line))
        for place, text in runs:
            self.run(place, text, timeout_s)

    def _clusters(self) -> set[str]:
        return set(self.sites.namespaces) | {p.name[5:] for p in self.root.glob("site-*")}

    def _names(self, line: str) -> list[str]:
        """The sites' names that `line` mentions (`A`, `G1`: standing alone), in order."""
        words = re.findall(r"(?<![A-Za-z0-9])([A-Z][A-Z0-9]*)(?![A-Za-z0-9])", _strip_comment(line))
        return [w for w in words if w in self._clusters()]

    def run(self, place: str, line: str, timeout_s: float = 300.0, exit_code: int = 0
            ) -> subprocess.CompletedProcess | None:
        """Run one command line at `place` ("admin" or a cluster); fail with its output unless it exits
        `exit_code`."""
        self.ran.append((place, line))
        command = _strip_comment(line)
        background = command.endswith("&")
        command = command.rstrip("&").strip()
        cwd = self.admin if place == "admin" else self.site_dir(place)
        prefix = [] if place == "admin" else self.sites.argv(place, [])
        argv = [*prefix, "bash", "-c", command]
        if background:
            log = self.logs / f"{place}-{len(self.ran)}.log"
            with open(log, "wb") as out:
                p = self.procs.start(argv, cwd=str(cwd), env=self.env, stdout=out, stderr=subprocess.STDOUT)
            if re.search(r"(^|/)start$|nebula-switch serve", command):
                self.servers.setdefault(place, []).append(p)
                self._wait_listening(p, log, command)
            else:
                self.background.append((place, command, p, log))
            return None
        r = subprocess.run(argv, cwd=str(cwd), env={**os.environ, **self.env}, capture_output=True, text=True,
                           timeout=timeout_s)
        assert r.returncode == exit_code, f"[{place}] {command}: exit {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        self.stdout[len(self.ran)] = r.stdout
        return r

    @staticmethod
    def _wait_listening(p: subprocess.Popen, log: Path, command: str, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if "listening wan=" in log.read_text(errors="replace"):
                return
            if p.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{command} did not start: {log.read_text(errors='replace')[-3000:]}")

    def wait_background(self, timeout_s: float) -> None:
        """Wait for the block's background jobs; each must exit 0 (the first that does not fails the block at once:
        its partners would only wait for it)."""
        jobs, self.background = self.background, []
        deadline = time.monotonic() + timeout_s
        while jobs:
            for job in list(jobs):
                place, command, p, log = job
                code = p.poll()
                if code is not None:
                    assert code == 0, f"[{place}] {command} &: exit {code}\n{log.read_text(errors='replace')[-3000:]}"
                    jobs.remove(job)
            assert time.monotonic() < deadline, f"still running after {timeout_s} s: {[j[1] for j in jobs]}"
            time.sleep(0.2)

    def output(self, place: str, fragment: str) -> str:
        """What the last command at `place` containing `fragment` printed (its log, when in the background)."""
        for n, (where, line) in reversed(list(enumerate(self.ran, 1))):
            if where == place and fragment in line:
                log = self.logs / f"{place}-{n}.log"
                return self.stdout[n] if n in self.stdout else log.read_text(errors="replace")
        raise AssertionError(f"no command with {fragment!r} ran on {place}")

    def result(self, place: str, fragment: str) -> dict:
        """The JSON a probe at `place` printed last."""
        return json.loads(self.output(place, fragment).strip().splitlines()[-1])

    def stop_servers(self, clusters: Sequence[str] | None = None) -> dict[str, int]:
        """SIGTERM the switch servers of `clusters` (all); their exit codes."""
        codes = {}
        for place, ps in self.servers.items():
            if clusters is None or place in clusters:
                for p in ps:
                    codes[place] = p.returncode if p.poll() is not None else self.procs.stop(p)
        return codes

    def collect(self, into: str = "review") -> Path:
        """Copy each site's fed/<cluster> into the admin's `into`/ (as the admin would after the run)."""
        dest = self.admin / into
        dest.mkdir(exist_ok=True)
        for d in sorted(self.root.glob("site-*")):
            cluster = d.name[5:]
            if (d / "fed" / cluster).is_dir():
                shutil.copytree(d / "fed" / cluster, dest / cluster, symlinks=True)
        return dest
