"""Every dotted name docs/architecture.md and docs/recovery.md cite in code spans resolves in the code: a module
(`nebula.wire.frame`, or a tail of one such as `secagg.vss`), a module's attribute (`security.updates.check_update`),
or a class's member (`Reduction.refusal`). What is not code is recognised: file names (`crl.pem`), job- and
switch-file keys (`train.stale_weights`, checked against the sections below), audit actions (`fl.stop`) and the few
local names a passage speaks of (NOT_CODE, each with why). A renamed or moved function fails here, not in a reader's
hands."""
from __future__ import annotations

import ast
import importlib
import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = [REPO / "docs" / "architecture.md", REPO / "docs" / "recovery.md"]
ROOTS = ("nebula", "security", "switch_server", "recipes", "benchmarks")
FILE_SUFFIXES = {"pem", "json", "yaml", "sig", "md", "py", "log", "db", "npz", "key", "gz"}
# the first word of a job-file or switch-file key path; an audit action's family
CONFIG_SECTIONS = {"train", "data_parallel", "secure_aggregation", "differential_privacy", "compression", "limits",
                   "link", "local", "checkpoint", "pipeline", "recovery"}
AUDIT_FAMILIES = {"fl"}
NOT_CODE = {
    "self.r": "the stage runner's hooks object, as a passage names it",
    "coord.pause_requested": "the recovery coordinator a rank holds, as the passage names it (RecoveryCoordinator)",
    "paddle.distributed.launch": "Paddle's launcher module, not this project's",
}
CITED = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?`")


def _cited() -> list[tuple[str, str]]:
    return sorted({(path.name, name) for path in DOCS for name in CITED.findall(path.read_text(encoding="utf-8"))})


@lru_cache(maxsize=1)
def _modules() -> tuple[str, ...]:
    out = []
    for root in ROOTS:
        for p in (REPO / root).rglob("*.py"):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return tuple(sorted(out))


@lru_cache(maxsize=1)
def _classes() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Class name -> (member names, base class names) of each class of that name (members: methods, class
    attributes, and the attributes its methods set on `self`), read from the source: nothing imported."""
    out: dict[str, list[tuple[set[str], list[str]]]] = {}
    for m in _modules():
        path = REPO / Path(*m.split("."))
        src = path.with_suffix(".py") if path.with_suffix(".py").exists() else path / "__init__.py"
        for node in ast.walk(ast.parse(src.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                members = set()
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub is not node:
                        members.add(sub.name)
                    elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                        members.add(sub.id)
                    elif (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)
                          and isinstance(sub.value, ast.Name) and sub.value.id == "self"):
                        members.add(sub.attr)
                bases = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                         if isinstance(b, (ast.Name, ast.Attribute))]
                out.setdefault(node.name, []).append((members, bases))
    return out


def _member(cls: str, name: str, seen: frozenset[str] = frozenset()) -> bool:
    """Whether a class named `cls` (or a class it derives from, found by name) has member `name`."""
    return cls not in seen and any(name in members or any(_member(b, name, seen | {cls}) for b in bases)
                                   for members, bases in _classes().get(cls, []))


def _has(obj: object, attrs: list[str]) -> bool:
    for a in attrs:
        if not hasattr(obj, a) and a not in getattr(obj, "__annotations__", {}):
            return False
        obj = getattr(obj, a, None)
    return True


def resolves(name: str) -> bool:
    """Whether `name` is a module, a module's attribute path, or a class's member path of the code."""
    parts = name.split(".")
    if parts[0][0].isupper():  # Class.member (one level: what the docs cite)
        return len(parts) == 2 and _member(parts[0], parts[1])
    for k in range(len(parts), 0, -1):
        head = ".".join(parts[:k])
        for m in _modules():
            if m == head or m.endswith("." + head):
                if _has(importlib.import_module(m), parts[k:]):
                    return True
    return False


def _not_code(name: str) -> bool:
    first, last = name.split(".")[0], name.split(".")[-1]
    return last in FILE_SUFFIXES or first in CONFIG_SECTIONS | AUDIT_FAMILIES or name in NOT_CODE


@pytest.mark.parametrize("doc,name", [c for c in _cited() if not _not_code(c[1])], ids=lambda x: str(x))
def test_every_dotted_name_the_docs_cite_resolves_in_the_code(doc, name):
    assert resolves(name), (f"{doc} cites `{name}`, which is no module, attribute or class member of the code: "
                            f"name what the code calls it now")


def test_the_check_tells_a_moved_name_from_a_real_one():
    assert resolves("nebula.hybrid.runner.run_hybrid") and resolves("secagg.vss") and resolves("Reduction.refusal")
    assert not resolves("nebula.hybrid.run_hybrid") and not resolves("Reduction.no_such_member")
    assert not resolves("nebula.no_such_module")


def _named(text: str, name: str) -> bool:
    return re.search(rf"`(nebula\.)?{re.escape(name)}[`./]|nebula\.{re.escape(name)}\b", text) is not None


def test_the_layer_list_names_every_package_of_nebula_and_every_module_of_the_federated_package():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    nebula = REPO / "nebula"
    names = sorted({p.name for p in nebula.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
                   | {p.stem for p in nebula.glob("*.py") if p.stem != "__init__"})
    federated = sorted(p.stem for p in (nebula / "federated").glob("*.py") if p.stem != "__init__")
    missing = [n for n in names if not _named(text, n)] + [f"federated/{m}" for m in federated
                                                           if f"`{m}`" not in text]
    assert not missing, f"docs/architecture.md does not name {missing}: add each to its layer list"
