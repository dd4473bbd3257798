"""report_to="tensorboard": scalars to a SummaryWriter (needs the tensorboard package, or tensorboardX as in transformers)."""

from __future__ import annotations

import os

from lathe.train.callbacks.events import TrainerCallback


class TensorBoardCallback(TrainerCallback):
    def __init__(self, tb_writer=None):
        self.tb_writer = tb_writer

    def _writer(self, args):
        if self.tb_writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                try:  # transformers' fallback: the same scalars through tensorboardX
                    from tensorboardX import SummaryWriter
                except ImportError as error:
                    raise ImportError(
                        "report_to='tensorboard' needs the tensorboard (or tensorboardX) package: "
                        "pip install 'lathe[tensorboard]'"
                    ) from error
            log_dir = getattr(args, "logging_dir", None) or os.path.join(args.output_dir, "runs")
            self.tb_writer = SummaryWriter(log_dir=log_dir)
        return self.tb_writer

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self._writer(args).add_text("args", args.to_json_string())

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        writer = self._writer(args)
        for key, value in logs.items():
            if isinstance(value, (int, float)):
                tag = key if key.startswith(("eval_", "test_")) else f"train/{key}"
                writer.add_scalar(tag.replace("eval_", "eval/", 1), value, state.global_step)
        writer.flush()

    def on_train_end(self, args, state, control, **kwargs):
        if self.tb_writer is not None:
            self.tb_writer.close()
            self.tb_writer = None
