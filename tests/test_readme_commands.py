"""Every command printed in README.md, the recipes' READMEs and docs/ is run as printed by a test, or it rots: this
guard fails for a printed command (a line of a ```bash block, or an inline span that starts with a program) that no
test runs. Recognised, not listed: forms to fill in (JOB, a|b, [--x], ...) and a program's, subcommand's or option's
name in prose. Listed below, each with why: forms whose placeholder is one letter, shell settings, installs (NOT_RUN),
and the printed commands no test runs yet (PENDING; the guard fails once one is run, or no longer printed)."""
from __future__ import annotations

import importlib
import re
import shlex

from tests.harness.readme import REPO, bash_lines, invocations, is_template, readme_files

# printed spans not run as printed: forms whose one-letter words stand for a cluster, a file or a directory, a
# shell's settings, and installs
NOT_RUN = {
    "nebula-switch reload --config F": "F: any switch.yaml",
    "nebula fl start job.yaml --cluster C": "C: each cluster",
    "nebula launch job.yaml --cluster C": "C: each cluster",
    "nebula launch job.yaml --cluster C --supervise": "C: the lost cluster",
    "python -m recipes.abnet.train --encoder-data A --decoder-data B --work W": "A, B, W: directories",
    "nebula launch E/intra.yaml --cluster D": "E: the run directory of the commands above it",
    "python -m recipes.electra.prepare data --out E": "E: a run directory",
    "python -m recipes.electra.prepare export --ckpt E/ckpt_intra/step_00001500 --data E/D/data --out "
    "E/bases/intra1500": "E: a run directory",
    "sed -e s/@PRESET@/tiny/ -e s/@STEPS@/3000/ -e s/@DECAY@/3000/ -e s/@EVERY@/750/ recipes/electra/configs/"
    "intra.yaml.in > E/intra.yaml": "E: a run directory",
    "nice -n 5": "the niceness both runs had, not a command",
    ". .venv/bin/activate": "a shell's own setting (what run_printed does for every command: the venv's bin first)",
    # installs: what .ci/run does on a fresh machine (system packages, the extras), not run by a test
    "apt-get install nftables": "system packages; .ci/run installs them for the root tests",
    "apt-get install stunnel4 socat": "system packages; the relay benchmark skips a path not installed",
    "apt-get install --reinstall iso-codes coreutils grep tar findutils diffutils gettext libc-bin": "system packages",
    "pip install -e '.[formers]'": "an extra; .ci/run installs it (with test)",
    "pip install -e '.[nlp,test]'": "an extra; .ci/run installs it in .venv-nlp",
}

# printed commands no test runs as printed yet: hours of training or benchmarking at the sizes printed, or a job
# file assembled in prose; each needs a test of its own (slow) and, for CI, a smaller printed command
PENDING: dict[str, str] = {}


def _run_by_tests() -> set[str]:
    """The printed commands the tests run as printed: each test module that runs some names them in its module-level
    `PRINTED` (found by that name, so a new test needs no entry here)."""
    run = set()
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        if re.search(r"^PRINTED\b", path.read_text(encoding="utf-8"), re.M):
            run |= set(importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts)).PRINTED)
    return run


def _run_by_the_suite(command: str) -> bool:
    """A `pytest` or `make` command the suite itself is: CI runs `make venv` and `make test`, the other targets are
    subsets of the suite; a pytest command's files exist and its `-k` word names a test in them."""
    words = shlex.split(command)
    if words[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
        return len(words) == 1 or all(w in targets for w in words[1:])
    if words[0] != "pytest":
        return False
    files = [REPO / w for w in words[1:] if w.startswith("tests/")]
    k = words[words.index("-k") + 1] if "-k" in words else ""
    return all(f.exists() for f in files) and (not k or any(re.search(rf"def test_\w*{k}", f.read_text())
                                                            for f in files))


def _a_name(command: str, text: str) -> bool:
    """An inline span that names a program, a subcommand or an option in prose (`nebula launch --elastic`,
    `nebula-switch serve/reload/status/probe`, `python -m nebula.logbook`), never a line of a ```bash block of
    `text`."""
    words = command.split()
    return (command not in bash_lines(text) and len(words) <= 4
            and all(re.fullmatch(r"[a-z_][\w/-]*|--?[a-z][\w-]*", w)
                    or (before == "-m" and re.fullmatch(r"[\w.]+", w))  # (a module's name)
                    for before, w in zip(words, words[1:])))


def _unaccounted(text: str, run: set[str]) -> list[str]:
    """Every command markdown `text` prints that no test runs (`run`) and neither list accounts for, sorted."""
    return [c for c in sorted(invocations(text))
            if not (c in run or c in NOT_RUN or c in PENDING or is_template(c) or _run_by_the_suite(c)
                    or _a_name(c, text))]


def _printed() -> set[str]:
    return {c for p in readme_files() for c in invocations(p.read_text(encoding="utf-8"))}


def test_every_command_printed_in_a_readme_or_doc_is_run_by_a_test():
    assert len(_printed()) >= 150, len(_printed())  # (the finder still finds the files' commands: 214 now)
    run = _run_by_tests()
    missing = {str(p.relative_to(REPO)): found for p in readme_files()
               if (found := _unaccounted(p.read_text(encoding="utf-8"), run))}
    assert not missing, (f"printed commands no test runs as printed: {missing}; add each to a test that runs it "
                         "(tests/harness/readme.py: run_printed) and checks what it prints")


def test_the_lists_of_forms_and_pending_commands_are_current():
    printed, run = _printed(), _run_by_tests()
    gone = sorted(c for c in {**NOT_RUN, **PENDING} if c not in printed)
    assert not gone, f"no longer printed (drop them from NOT_RUN / PENDING): {gone}"
    now_run = sorted((set(PENDING) | set(NOT_RUN)) & run)
    assert not now_run, f"now run by a test (drop them from PENDING): {now_run}"


def test_the_guard_finds_a_command_printed_anywhere_and_tells_forms_from_commands():
    text = ("Run `PYTHONPATH=. .venv/bin/python benchmarks/new.py --only x` or `nebula fl status JOB`;\n"
            "`nebula launch --elastic` relaunches, `bash recipes/x/run.sh [RUN_DIR]` too.\n"
            "```bash\nnebula-admin provision --clusters A,B --out fed   # the kits\n# a comment\nnebula launch\n```\n")
    found = ["PYTHONPATH=. .venv/bin/python benchmarks/new.py --only x",
             "nebula-admin provision --clusters A,B --out fed"]
    assert sorted(_unaccounted(text, set())) == sorted([*found, "nebula launch"])  # (a bash line: a command)
    assert sorted(_unaccounted(text, {"nebula launch"})) == sorted(found)
    assert not is_template('python -m x --locale-dir "${LOCALE_DIR:-/usr/share/locale}"')
    assert is_template("ALGORITHM=fedoptima|owl recipes/federated/run_local.sh")
