"""A pytest plugin that records each test's wall and CPU seconds (this process and the children it waited for)
into a JSON file, to find what makes the suite slow even while other work loads the machine (CPU seconds change
little with load; wall seconds change a lot). Children not waited for (Ray's daemons) are not counted.

    PYTHONPATH=bench python -m pytest -p suite_cpu -q          # writes suite_cpu.json (or $SUITE_CPU_OUT)
    PYTHONPATH=bench python -m pytest -p suite_cpu -q -n 2 --dist loadfile   # one file per xdist worker:
                                                                # suite_cpu.gw0.json, suite_cpu.gw1.json
    python bench/suite_cpu.py suite_cpu*.json                   # the 40 costliest tests and files
    python bench/suite_cpu.py suite_cpu*.json --order tests/suite_order.txt   # rewrite the file order hint

tests/suite_order.txt lists the test files longest first: tests/conftest.py hands them to the xdist workers in
that order (the README's command runs `-n auto --dist loadfile`), so the long files start first and the short ones
fill the gaps at the end. It is a scheduling hint only: a stale or missing list changes the wall time, never what
runs.
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
    path = os.environ.get("SUITE_CPU_OUT", "suite_cpu.json")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # each xdist worker writes its own file (the controller ran no test)
        path = path.removesuffix(".json") + f".{worker}.json"
    elif not _rows:
        return
    with open(path, "w") as handle:
        json.dump(_rows, handle)


def load(paths: list[str]) -> list:
    return [row for path in paths for row in json.load(open(path))]


def write_order(rows: list, path: str) -> None:
    """The test files, longest first: tests/conftest.py's scheduling hint for xdist. A file's length is the seconds
    a worker is busy with it, wall or CPU, whichever is more per test (Ray's workers, not children of the test,
    use CPU the test's own count misses; a test waiting on a timeout uses wall and no CPU)."""
    files: dict[str, float] = defaultdict(float)
    for name, wall, own, children in rows:
        files[name.split("::")[0]] += max(wall, own + children)
    lines = [f"{name}  # {seconds:.0f} s" for name, seconds in sorted(files.items(), key=lambda item: -item[1])]
    header = "# test files, longest first (bench/suite_cpu.py --order): the order xdist workers get them in\n"
    with open(path, "w") as handle:
        handle.write(header + "\n".join(lines) + "\n")


def report(paths: list[str], top: int = 40) -> None:
    rows = load(paths)
    print(f"{len(rows)} tests: {sum(r[1] for r in rows):.0f} s wall, {sum(r[2] + r[3] for r in rows):.0f} CPU s")
    for name, wall, own, children in sorted(rows, key=lambda r: -(r[2] + r[3]))[:top]:
        print(f"{own + children:7.1f} CPU s ({children:6.1f} in children) {wall:7.1f} s wall  {name}")
    files: dict[str, float] = defaultdict(float)
    for name, _, own, children in rows:
        files[name.split("::")[0]] += own + children
    for name, seconds in sorted(files.items(), key=lambda item: -item[1])[:top]:
        print(f"{seconds:7.1f} CPU s  {name}")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    if "--order" in arguments:
        at = arguments.index("--order")
        order, arguments = arguments[at + 1], arguments[:at] + arguments[at + 2 :]
        write_order(load(arguments), order)
    report(arguments)
