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
PENDING = {
    # README.md
    ".venv/bin/python benchmarks/wan_quality.py --json runs/wan_quality/rows.json": "the full table (about 2 hours "
    "on 2 cores); tests/llm/test_wan_quality_bench.py runs --quick, every mode at a small size",
    ".venv/bin/python benchmarks/wan_quality.py --scale --from runs/wan_quality/rows.json": "the largest model on a "
    "million tokens per row (hours), after the full table",
    ".venv/bin/python benchmarks/wan_quality.py --report runs/wan_quality/rows.json runs/wan_quality/rows2.json":
        "reads the full-size rows' files, which the full table's runs write (hours)",
    ".venv/bin/python benchmarks/wan_quality.py --rows streaming,fp4,topk2 --seeds 1 --workers 1 --json "
    "runs/wan_quality/extra.json": "five full-size rows (40 min)",
    ".venv/bin/python benchmarks/wan_quality.py --rows 'diloco H=100 int8,diloco H=10 int8' --outer-momentum 0 "
    "--seeds 1 --json runs/wan_quality/rows-m0.json": "three full-size rows (30 min)",
    "make venv && bash recipes/abnet/run_local.sh": "the main job (2000 steps); tests/recipes run its script at 60",
    "bash recipes/llm/run_local.sh": "200 steps; tests/llm/test_recipe.py runs it at 12",
    "nebula bench job.yaml --cluster A --out profiles/A.yaml": "job.yaml assembled from the section's prose",
    "nebula bench job.yaml --cluster B --out profiles/B.yaml": "job.yaml assembled from the section's prose",
    "nebula launch job.yaml --cluster A": "job.yaml assembled from the section's prose",
    "nebula launch job.yaml --cluster A --elastic": "job.yaml assembled from the section's prose",
    "nebula allocate --model job.yaml": "a name of the option in prose, with the section's job",
    # recipes/abnet/README.md
    "bash recipes/abnet/run_local.sh runs/main-int8": "the main job (2000 steps)",
    "python -m recipes.abnet.prepare data --encoder-out D/A --decoder-out D/B --langs es --max-words 6 "
    "--vocab-top-k 300 --test-per-mille 100": "the first of a three-command sequence (6000 steps)",
    "python -m recipes.abnet.train --encoder-data D/A --decoder-data D/B --work D/w --config "
    "recipes/abnet/configs/tiny.yaml --steps 6000": "6000 steps",
    "python benchmarks/abnet_table5.py --paper-shape --work runs/table5": "the paper's shapes (hours)",
    "python benchmarks/abnet_table5.py --steps 2000 --warmup 20 --seeds 3 --procs 2 --bleu --fig10 1000 --work "
    "runs/table5": "hours",
    "python benchmarks/abnet_table5.py --steps 30 --warmup 5 --seeds 3 --procs 2 --work runs/table5": "minutes",
    "python benchmarks/compression.py --cpu-paths": "minutes",
    "python benchmarks/compression.py --demo-shapes": "minutes",
    # recipes/electra/README.md
    "bash recipes/electra/run_local.sh": "400 steps",
    "bash recipes/electra/run_local.sh /tmp/elmain": "400 steps",
    "python -m recipes.abnet.prepare data --encoder-out A/data --decoder-out B/data --langs es --max-words 6 "
    "--vocab-top-k 300 --test-per-mille 100": "the first of an ABNet-on-ELECTRA sequence (hours)",
    "python -m recipes.abnet.train --encoder-data A/data --decoder-data B/data --work default --config default.yaml":
        "hours",
    "python -m recipes.abnet.train --encoder-data A/data --decoder-data B/data --work electra --config electra.yaml":
        "hours",
    "python -m recipes.electra.prepare data --out /tmp/electra-long --max-per-language 0": "the long pretraining",
    "python -m recipes.electra.prepare export --ckpt /tmp/electra-long/ckpt_intra/step_00000750 --data "
    "/tmp/electra-long/D/data --out /tmp/electra-long/bases/intra750": "the long pretraining",
    "python -m recipes.electra.summary --progress /tmp/electra-long/metrics_intra/D.rank0.jsonl 750,1500,2250":
        "the long pretraining",
    "nice -n 5 nebula launch /tmp/electra-long/intra.yaml --cluster D & nice -n 5 nebula launch "
    "/tmp/electra-long/english.yaml --cluster D": "the long pretraining",
    "python benchmarks/electra.py": "hours",
    "python benchmarks/electra.py --out /tmp/elbench12": "hours",
    # recipes/federated/README.md
    "bash recipes/federated/run_local.sh /tmp/flrun3": "15 rounds; the sites' test runs the recipe at 3",
    "ALGORITHM=fedoptima bash recipes/federated/run_local.sh /tmp/flmodes-rfo": "minutes",
    ".venv/bin/python benchmarks/diloco.py --steps 600 --sync-every 50 --momentum 0,0.9 --data langid.npz":
        "600 steps in six configurations",
    "PYTHONPATH=. .venv/bin/python benchmarks/federated.py --only accuracy,robust --rounds 3 --clients 10 --data "
    "/tmp/flrun1/data/langid.npz": "needs a run's data first",
    "PYTHONPATH=. .venv/bin/python benchmarks/federated.py --only codec --rounds 5 --clients 10": "minutes",
    "PYTHONPATH=. .venv/bin/python benchmarks/federated.py --only memory --mem-mb 256": "minutes",
    "PYTHONPATH=. .venv/bin/python benchmarks/federated.py --only scale --counts 200,1000 --scale-rounds 4":
        "1000 clients",
    "PYTHONPATH=. .venv/bin/python benchmarks/federated.py --only wan": "minutes",
    "PYTHONPATH=. .venv/bin/python benchmarks/idle_time.py --skip-owl --wall-s 10": "the README's command, with "
                                                                                      "PYTHONPATH",
    "cd recipes/federated/configs": "the first of a DiLoCo sequence of 600 steps",
    "nebula-admin provision --federation dp --clusters A,B --out fed": "the DiLoCo sequence",
    "python -c \"from recipes.federated.data import prepare; prepare('langid.npz')\"": "the DiLoCo sequence",
    "nebula-switch serve --config fed/A/switch.yaml & nebula launch data_parallel.yaml --cluster A":
        "the DiLoCo sequence",
    "nebula-switch serve --config fed/B/switch.yaml & nebula launch data_parallel.yaml --cluster B":
        "the DiLoCo sequence",
    "python -m recipes.federated.replica ckpt/A/step_00000600 --data langid.npz": "the DiLoCo sequence",
    # recipes/llm/README.md
    "nebula allocate --model pipeline.yaml --devices devices.yaml --write-job pipeline.yaml": "in prose",
}


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
