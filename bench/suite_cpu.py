"""A pytest plugin that records each test's wall and CPU seconds (this process and the children it waited for)
into a JSON file, to find what makes the suite slow even while other work loads the machine (CPU seconds change
little with load; wall seconds change a lot). Children not waited for (Ray's daemons) are not counted.

    PYTHONPATH=bench python -m pytest -p suite_cpu -q          # writes suite_cpu.json (or $SUITE_CPU_OUT)
    python bench/suite_cpu.py suite_cpu.json                    # the 40 costliest tests and files
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict

import pytest

_rows: list[tuple[str, float, float, float]] = []


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, (own, children) = time.perf_counter(), _cpu()
    yield
    own_after, children_after = _cpu()
    _rows.append((item.nodeid, time.perf_counter() - wall, own_after - own, children_after - children))


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ.get("SUITE_CPU_OUT", "suite_cpu.json"), "w") as handle:
        json.dump(_rows, handle)


def report(path: str, top: int = 40) -> None:
    rows = json.load(open(path))
    print(f"{len(rows)} tests: {sum(r[1] for r in rows):.0f} s wall, {sum(r[2] + r[3] for r in rows):.0f} CPU s")
    for name, wall, own, children in sorted(rows, key=lambda r: -(r[2] + r[3]))[:top]:
        print(f"{own + children:7.1f} CPU s ({children:6.1f} in children) {wall:7.1f} s wall  {name}")
    files: dict[str, float] = defaultdict(float)
    for name, _, own, children in rows:
        files[name.split("::")[0]] += own + children
    for name, seconds in sorted(files.items(), key=lambda item: -item[1])[:top]:
        print(f"{seconds:7.1f} CPU s  {name}")


if __name__ == "__main__":
    report(sys.argv[1])
