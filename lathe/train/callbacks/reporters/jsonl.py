"""report_to="jsonl": every log event appended as one JSON line to output_dir/log_history.jsonl."""

from __future__ import annotations

import json
import os

from lathe.train.callbacks.events import TrainerCallback


class JsonlLoggerCallback(TrainerCallback):
    """Appends each on_log's log_history entry, on the main process; survives a crash line by line."""

    file_name = "log_history.jsonl"

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or logs is None:
            return
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, self.file_name), "a", encoding="utf-8") as f:
            # The log_history entry on_log was called for: PrinterCallback (disable_tqdm), which runs first,
            # pops total_flos from `logs` as transformers' does, and the file stays equal to log_history.
            entry = state.log_history[-1] if state.log_history else {**logs, "step": state.global_step}
            f.write(json.dumps(entry) + "\n")
