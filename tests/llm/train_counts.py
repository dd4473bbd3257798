"""The parameter counts a run trains with, as the LLaMA-Factory training goldens record them beside the losses."""

from lathe.train import TrainerCallback


class ParameterCount(TrainerCallback):
    """(trainable, total) parameters when training begins, a parameter shared by two modules counted once."""

    counts: tuple[int, int] | None = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        seen = {id(p): p for p in model.parameters()}.values()
        self.counts = (sum(p.numel() for p in seen if p.requires_grad), sum(p.numel() for p in seen))
