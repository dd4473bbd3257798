"""pissa_convert: besides the PiSSA adapter (which needs the residual base PiSSA left behind), save the
adapter converted to a plain LoRA of the original base, as LLaMA-Factory does:

    output_dir/pissa_init/       the adapter as initialised (before the first step)
    output_dir/pissa_backup/     the trained PiSSA adapter
    output_dir/pissa_converted/  the trained adapter as a rank-2r LoRA on the *original* weights
"""

from __future__ import annotations

import logging
import os

from lathe.train.callbacks.events import TrainerCallback

__all__ = ["PissaConvertCallback"]

logger = logging.getLogger(__name__)


def _save_as_plain_init(model, folder: str, **kwargs) -> None:
    """Save with init_lora_weights: true in the config, so loading the folder does not run PiSSA's SVD again."""
    config = model.peft_config["default"]
    init = config.init_lora_weights
    config.init_lora_weights = True
    try:
        model.save_pretrained(folder, **kwargs)
    finally:
        config.init_lora_weights = init


class PissaConvertCallback(TrainerCallback):
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from peft import PeftModel

        if args.should_save and isinstance(model, PeftModel):
            folder = os.path.join(args.output_dir, "pissa_init")
            logger.info("Initial PiSSA adapter saved in %s", folder)
            _save_as_plain_init(model, folder)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        from peft import PeftModel

        if not (args.should_save and isinstance(model, PeftModel)):
            return
        init_dir, backup_dir, converted_dir = (
            os.path.join(args.output_dir, name) for name in ("pissa_init", "pissa_backup", "pissa_converted")
        )
        init = model.peft_config["default"].init_lora_weights
        _save_as_plain_init(model, backup_dir)
        # peft subtracts the initial adapter and folds the residual change into a rank-2r LoRA.
        model.save_pretrained(converted_dir, path_initial_model_for_weight_conversion=init_dir)
        # The conversion edits the live adapter; reload the trained one. Its config keeps saying how it was
        # initialised (the adapter saved in output_dir needs PiSSA's residual base, which peft rebuilds on load).
        model.load_adapter(backup_dir, "default", is_trainable=True)
        model.set_adapter("default")
        model.peft_config["default"].init_lora_weights = init
        logger.info("PiSSA adapter converted to a LoRA of the original base in %s", converted_dir)
