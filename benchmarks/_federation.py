"""A throwaway federation for benchmarks: provisioned clusters, one real switch server each, links optionally shaped."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import yaml

__all__ = ["Federation"]

BIN = Path(sys.executable).parent


class Federation:
    """Clusters provisioned under `root`, each with its switch server; links shaped to `rate_mbit` (None: unshaped).

    Stopped by `close()` (also when a switch fails to start)."""

    def __init__(self, root: Path, clusters: list[str], rate_mbit: float | None, delay_ms: float = 0.0,
                 name: str = "bench") -> None:
        from security.provision import provision

        self.dir, self.procs = root, []
        provision(name, clusters, root)
        logs = {}
        for c in clusters:
            sw = root / c / "switch.yaml"
            doc = yaml.safe_load(sw.read_text())
            if rate_mbit:
                doc.setdefault("link", {})["shape"] = {"rate_mbit": rate_mbit, "delay_ms": delay_ms}
            doc["metrics"] = {"listen": None}
            sw.write_text(yaml.safe_dump(doc, sort_keys=False))
            logs[c] = sw.parent / "switch.log"
            with logs[c].open("w") as out:
                self.procs.append(subprocess.Popen([str(BIN / "nebula-switch"), "serve", "--config", str(sw)],
                                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        for (c, log), p in zip(logs.items(), self.procs):
            deadline = time.monotonic() + 60
            while "listening wan=" not in log.read_text():
                if p.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise RuntimeError(f"switch {c} did not start: {log.read_text()[-2000:]}")
                time.sleep(0.1)

    def worker(self, cluster: str) -> str:
        """The worker.yaml of `cluster`'s switch."""
        return str(self.dir / cluster / "worker.yaml")

    def close(self) -> None:
        """Stop the switch servers."""
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
