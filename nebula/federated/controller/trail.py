"""Model trail: every global model with its version, parent, round, strategy, clients and metrics.

The index is SQLite (`trail.db`); tensors live in files (`models/<version>.npz`, the strategy's server state in
`state/<version>.npz`), each written to a temporary name and renamed, both on disk (written side by side), before
the index row is committed, so a crash leaves either a complete model or none. A restarted controller resumes from
`head()`; `export` writes any model. Rounds (valid or not, with their rejected updates) are kept too, for `nebula fl
rounds`, and every draw of a round's clients under differential privacy (`record_draw`), written before the round
starts so a crash loses none.

The index keeps a write-ahead log (SQLite's WAL): a commit costs one flush to disk (of the log) where a rollback
journal costs three or four. A model's row and a draw are on disk when their call returns; a round's record is
written without waiting for the disk (`record_round`): a killed process loses none, and the machine stopping loses at
most the records since the last model's commit, never a model (a valid round's row keeps its round, clients and
metrics; an invalid round is run again, as one the controller died in).
"""
from __future__ import annotations

import json
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from security._files import PUBLIC, atomic_write

__all__ = ["ModelTrail", "ModelRecord", "RoundRecord"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS models (
    version INTEGER PRIMARY KEY, parent INTEGER, round INTEGER NOT NULL, strategy TEXT NOT NULL,
    clients TEXT NOT NULL, metrics TEXT NOT NULL, created REAL NOT NULL, num_bytes INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY, status TEXT NOT NULL, version INTEGER, num_updates INTEGER NOT NULL,
    num_examples INTEGER NOT NULL, rejected TEXT NOT NULL, started REAL NOT NULL, duration_s REAL NOT NULL,
    detail TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS draws (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, round INTEGER NOT NULL, sampler TEXT NOT NULL, sampled INTEGER NOT NULL,
    drawn_at REAL NOT NULL);
"""


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelRecord:
    """One global model of the trail."""

    version: int
    parent: int | None
    round: int
    strategy: dict
    clients: list
    metrics: dict
    created: float
    num_bytes: int


@dataclass(frozen=True, kw_only=True, slots=True)
class RoundRecord:
    """One round of training: valid (committed as `version`) or not, and why."""

    round: int
    status: str
    version: int | None
    num_updates: int
    num_examples: int
    rejected: list
    started: float
    duration_s: float
    detail: dict


def _save_npz(path: Path, arrays: Mapping[str, np.ndarray]) -> int:
    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # (a file object: np.savez would add .npz to a name)
            np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})

    atomic_write(path, write, PUBLIC)
    return path.stat().st_size


def _read_only(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    out = {}
    for k, v in arrays.items():
        out[k] = np.asarray(v).view()
        out[k].flags.writeable = False
    return out


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


class ModelTrail:
    """The trail in directory `root` (created if missing)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        (self.root / "models").mkdir(parents=True, exist_ok=True)
        (self.root / "state").mkdir(exist_ok=True)
        self.db = sqlite3.connect(self.root / "trail.db", timeout=30, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")  # (kept in the file: every later opener uses it too)
        self.db.execute("PRAGMA synchronous=FULL")  # a commit is on disk when it returns
        self.db.executescript(_SCHEMA)
        self.db.commit()
        # the model's and the state's files are written and flushed side by side: their flushes overlap
        self._files = ThreadPoolExecutor(max_workers=2, thread_name_prefix="trail-files")
        # the newest model this trail committed, read-only: the next round starts from it without reading it back
        self._held: tuple[int, dict[str, np.ndarray], dict[str, np.ndarray]] | None = None

    def close(self) -> None:
        """Close the index (its write-ahead log is folded into `trail.db`, on disk)."""
        self._files.shutdown()
        self.db.close()

    def __enter__(self) -> ModelTrail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def commit(self, weights: Mapping[str, np.ndarray], *, parent: int | None, round: int, strategy: Mapping[str, Any],
               clients: list, metrics: Mapping[str, Any] | None = None,
               state: Mapping[str, np.ndarray] | None = None) -> int:
        """Store a new global model (tensor files first, then the index row); its version. The trail keeps read-only
        views of `weights` and `state` for `load`: the caller gives them up (never writes into them again)."""
        head = self.head()
        if parent is not None and (head is None or parent != head.version):
            raise ValueError(f"parent version {parent} is not the trail's head "
                             f"({head.version if head else 'empty'}); resume from the head")
        version = 1 if head is None else head.version + 1
        # both files whole and on disk before the row that names them is committed
        saved = [self._files.submit(_save_npz, self.root / d / f"{version}.npz", a)
                 for d, a in (("models", weights), ("state", state or {}))]
        nbytes = saved[0].result()
        saved[1].result()
        self.db.execute("INSERT INTO models VALUES (?,?,?,?,?,?,?,?)",
                        (version, parent, round, json.dumps(dict(strategy), default=str), json.dumps(clients),
                         json.dumps(dict(metrics or {}), default=float), time.time(), nbytes))
        self.db.commit()
        self._held = (version, _read_only(weights), _read_only(state or {}))
        return version

    def _record(self, row: tuple) -> ModelRecord:
        v, p, r, s, c, m, t, n = row
        return ModelRecord(version=v, parent=p, round=r, strategy=json.loads(s), clients=json.loads(c),
                           metrics=json.loads(m), created=t, num_bytes=n)

    def head(self) -> ModelRecord | None:
        """The newest model, or None for an empty trail."""
        row = self.db.execute("SELECT * FROM models ORDER BY version DESC LIMIT 1").fetchone()
        return None if row is None else self._record(row)

    def get(self, version: int) -> ModelRecord:
        """The record of `version`; KeyError naming the versions there are."""
        row = self.db.execute("SELECT * FROM models WHERE version=?", (version,)).fetchone()
        if row is None:
            head = self.head()
            last = head.version if head else 0
            raise KeyError(f"no model version {version} in trail {self.root} (versions 1..{last})")
        return self._record(row)

    def models(self) -> list[ModelRecord]:
        """Every model, oldest first."""
        return [self._record(r) for r in self.db.execute("SELECT * FROM models ORDER BY version")]

    def load(self, version: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(weights, server state) of `version` (the one this trail committed last without reading it back: its
        arrays are read-only)."""
        self.get(version)
        if self._held is not None and self._held[0] == version:
            return dict(self._held[1]), dict(self._held[2])
        return (_load_npz(self.root / "models" / f"{version}.npz"),
                _load_npz(self.root / "state" / f"{version}.npz"))

    def export(self, version: int, out: str | os.PathLike) -> Path:
        """Write the weights of `version` to `out` (.npz, numpy's format; `.pdparams` is saved with paddle)."""
        weights, _ = self.load(version)
        out = Path(out)
        if out.suffix == ".pdparams":
            import paddle  # late: the trail itself needs no paddle

            paddle.save({k: paddle.to_tensor(v) for k, v in weights.items()}, str(out))
        else:
            _save_npz(out if out.suffix == ".npz" else out.with_suffix(".npz"), weights)
        return out

    def record_round(self, rec: RoundRecord) -> None:
        """Store (or replace) the record of one round, without waiting for the disk: committed (every reader sees
        it, a killed process keeps it), on disk with the next model's commit or the trail's close (see the module's
        note)."""
        self.db.execute("PRAGMA synchronous=NORMAL")  # (WAL: the transaction is in the log, the log not flushed)
        try:
            self.db.execute("INSERT OR REPLACE INTO rounds VALUES (?,?,?,?,?,?,?,?,?)",
                            (rec.round, rec.status, rec.version, rec.num_updates, rec.num_examples,
                             json.dumps(rec.rejected), rec.started, rec.duration_s,
                             json.dumps(rec.detail, default=str)))
            self.db.commit()
        finally:
            self.db.execute("PRAGMA synchronous=FULL")

    def record_draw(self, round: int, sampler: str, sampled: int) -> None:
        """Record, durably (committed before it returns), that round `round` drew its clients: differential
        privacy counts the draw from here on, even if the process dies before the round's own record."""
        self.db.execute("INSERT INTO draws (round, sampler, sampled, drawn_at) VALUES (?,?,?,?)",
                        (round, sampler, sampled, time.time()))
        self.db.commit()

    def draws(self) -> list[int]:
        """The round of every recorded draw, in the order drawn (a round run again after a crash: twice)."""
        return [r for (r,) in self.db.execute("SELECT round FROM draws ORDER BY seq")]

    def rounds(self) -> list[RoundRecord]:
        """Every recorded round, in order."""
        out = []
        for r in self.db.execute("SELECT * FROM rounds ORDER BY round"):
            out.append(RoundRecord(round=r[0], status=r[1], version=r[2], num_updates=r[3], num_examples=r[4],
                                   rejected=json.loads(r[5]), started=r[6], duration_s=r[7], detail=json.loads(r[8])))
        return out
