"""Every benchmark command the README prints is run as printed by a test, or it rots: this guard fails for a printed
command that no test runs (the tests named below run each one, slow, and check what it prints)."""
from __future__ import annotations

import re

from tests.harness.readme import REPO, all_commands

BENCHMARK = re.compile(r"^(\w+=\S+ )*(\.venv/bin/)?python benchmarks/\w+\.py\b")


def _run_by_tests() -> set[str]:
    """The printed commands the README's benchmark tests run, as they find them."""
    from tests.balance.test_allocation_bench_slow import PRINTED as allocation
    from tests.federated.test_federated_bench_slow import _printed_commands as federated
    from tests.federated.test_idle_time_bench_slow import PRINTED as idle_time
    from tests.pipeline.test_pipeline_bench_slow import PRINTED as pipeline
    from tests.recovery.test_soak import PRINTED as soak
    from tests.switch.test_abuse_bench_slow import PRINTED as abuse
    from tests.switch.test_relay_bench import _printed_commands as relay

    return {*relay(), *federated("--only flower"), *federated("--only scale"), *pipeline, *soak, *abuse,
            *allocation, *idle_time}


def test_every_benchmark_command_the_readme_prints_is_run_by_a_test():
    printed = {c for c in all_commands((REPO / "README.md").read_text()) if BENCHMARK.match(c)}
    assert len(printed) >= 20, sorted(printed)  # (the finder still finds the README's commands)
    missing = sorted(printed - _run_by_tests())
    assert not missing, f"README commands no test runs as printed: {missing}; add them to a benchmark test"
