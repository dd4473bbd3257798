"""skip_memory_metrics=False: memory used by each stage of a Trainer (init, train, eval, test), reported
under transformers' metric names (`init_mem_cpu_alloc_delta`, `train_mem_cpu_peaked_delta`,
`before_init_mem_cpu`, and `*_mem_gpu_*` on an accelerator). The CPU side reads the process's resident
memory through psutil, the one module that imports it."""

from __future__ import annotations

import gc
import inspect
import threading
import time

_INSTALL_HINT = "skip_memory_metrics=False needs psutil to read the process's memory: pip install 'lathe[memory]' (or pip install psutil)"

# transformers derives the stage from the calling method's name; lathe's own callers pass it.
STAGES = {
    "__init__": "init",
    "train": "train",
    "_inner_training_loop": "train",
    "training_loop": "train",
    "evaluate": "eval",
    "predict": "test",
}


class TrainerMemoryTracker:
    """Resident CPU memory (and the accelerator's allocated memory) at a stage's start and end, and its
    peak in between: `<stage>_mem_<cpu|gpu>_alloc_delta` (end - start) and `..._peaked_delta` (peak - end).
    A stage started inside another (evaluation during training) is not measured on its own, as in
    transformers. With skip_memory_metrics=True every call does nothing."""

    def __init__(self, skip_memory_metrics: bool = False):
        self.skip_memory_metrics = skip_memory_metrics
        if skip_memory_metrics:
            return
        try:
            import psutil
        except ImportError as error:
            raise ImportError(_INSTALL_HINT) from error
        import torch

        self.torch = torch if torch.cuda.is_available() else None
        self.process = psutil.Process()
        self.cur_stage = None
        self.cpu, self.gpu = {}, {}
        self.init_reported = False
        self._monitor = None

    def derive_stage(self) -> str:
        caller = inspect.currentframe().f_back.f_back.f_code.co_name
        if caller not in STAGES:
            raise ValueError(f"was called from {caller}, but only expect to be called from one of {list(STAGES)}")
        return STAGES[caller]

    def cpu_mem_used(self) -> int:
        return self.process.memory_info().rss

    def _watch_peak(self) -> None:
        # Sampled every millisecond rather than in a busy loop (transformers'), which would take a core.
        while self.peak_monitoring:
            self.cpu_mem_used_peak = max(self.cpu_mem_used(), self.cpu_mem_used_peak)
            time.sleep(0.001)

    def started(self, stage: str) -> TrainerMemoryTracker:
        self.start(stage)
        return self

    def start(self, stage: str | None = None) -> None:
        if self.skip_memory_metrics:
            return
        stage = stage or self.derive_stage()
        if self.cur_stage is not None and self.cur_stage != stage:
            return
        self.cur_stage = stage
        gc.collect()
        if self.torch is not None:
            self.torch.cuda.reset_peak_memory_stats()
            self.torch.cuda.empty_cache()
            self.gpu_mem_used_at_start = self.torch.cuda.memory_allocated()
        self.cpu_mem_used_at_start = self.cpu_mem_used_peak = self.cpu_mem_used()
        self.peak_monitoring = True
        self._monitor = threading.Thread(target=self._watch_peak, daemon=True)
        self._monitor.start()

    def stop(self, stage: str) -> None:
        if self.skip_memory_metrics or self.cur_stage != stage:
            return  # not measuring, or a stage nested in the one measured (evaluation during training)
        self.peak_monitoring = False
        if self._monitor is not None:
            self._monitor.join()
        gc.collect()
        if self.torch is not None:
            self.torch.cuda.empty_cache()
            now, peak = self.torch.cuda.memory_allocated(), self.torch.cuda.max_memory_allocated()
            begin = self.gpu_mem_used_at_start
            self.gpu[stage] = {"begin": begin, "end": now, "alloc": now - begin, "peaked": max(0, peak - now)}
        now = self.cpu_mem_used()
        peak = max(self.cpu_mem_used_peak, now)
        begin = self.cpu_mem_used_at_start
        self.cpu[stage] = {"begin": begin, "end": now, "alloc": now - begin, "peaked": max(0, peak - now)}
        self.cur_stage = None

    def update_metrics(self, stage: str, metrics: dict) -> None:
        if self.skip_memory_metrics or (self.cur_stage is not None and self.cur_stage != stage):
            return
        stages = [stage]
        if not self.init_reported:  # the first report also carries the Trainer's construction
            stages.insert(0, "init")
            self.init_reported = True
        for name in stages:
            for kind in ("alloc", "peaked"):
                if kind in self.cpu.get(name, {}):
                    metrics[f"{name}_mem_cpu_{kind}_delta"] = self.cpu[name][kind]
                if self.torch is not None and kind in self.gpu.get(name, {}):
                    metrics[f"{name}_mem_gpu_{kind}_delta"] = self.gpu[name][kind]
        if stages[0] == "init" and "init" in self.cpu:
            metrics["before_init_mem_cpu"] = self.cpu["init"]["begin"]
            if self.torch is not None:
                metrics["before_init_mem_gpu"] = self.gpu["init"]["begin"]

    def stop_and_update_metrics(self, metrics: dict | None = None, stage: str | None = None) -> None:
        if self.skip_memory_metrics:
            return
        stage = stage or self.derive_stage()
        self.stop(stage)
        if metrics is not None:
            self.update_metrics(stage, metrics)
