"""report_to="jsonl": every log event appended as one JSON line to output_dir/log_history.jsonl."""

from __future__ import annotations

import json
import os

from lathe.train.callbacks.events import TrainerCallback


class JsonlLoggerCallback(TrainerCallback):
    """Appends {"step": ..., **logs} per on_log, on the main process; survives a crash line by line."""

    file_name = "log_history.jsonl"

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or logs is None:
            return
        os.makedirs(args.output_dir, exist_ok=True)
        with open(os.path.join(args.output_dir, self.file_name), "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": state.global_step, **logs}) + "\n")
