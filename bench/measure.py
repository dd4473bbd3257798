"""What a runner process measures about itself: timestamps, peak memory, and the JSON it hands back.

run_all.py passes the wall-clock time just before it spawned the process in BENCH_SPAWN_TIME, so
"start to first optimizer step" includes interpreter start-up and imports.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

_PROCESS_CLOCK_ORIGIN = time.perf_counter()


def spawn_time() -> float:
    """Wall-clock time the parent spawned us (falls back to now when run by hand)."""
    return float(os.environ.get("BENCH_SPAWN_TIME", time.time()))


def peak_rss_mb() -> float:
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def current_rss_mb() -> float:
    return _status_kib("VmRSS") / 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's high-water mark (VmHWM) so a later read covers only what follows."""
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def high_water_rss_mb() -> float:
    return _status_kib("VmHWM") / 1024


class profile_if_requested:
    """cProfile the enclosed block into $BENCH_PROFILE when that is set (see bench/README.md)."""

    def __enter__(self):
        self.path = os.environ.get("BENCH_PROFILE")
        if self.path:
            import cProfile

            self.profiler = cProfile.Profile()
            self.profiler.enable()
        return self

    def __exit__(self, *exc_info):
        if self.path:
            self.profiler.disable()
            self.profiler.dump_stats(self.path)
        return False


def write_result(path: str | None, result: dict) -> None:
    result.setdefault("peak_rss_mb", peak_rss_mb())
    result.setdefault("python", sys.version.split()[0])
    text = json.dumps(result, indent=1)
    if path:
        with open(path, "w") as handle:
            handle.write(text)
    else:
        print(text)
