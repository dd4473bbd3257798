"""The processor saved beside the trained model, as LLaMA-Factory's SaveProcessorCallback does: in every checkpoint
and in output_dir when training ends, so the result loads as a vision-language model with its processor."""

from __future__ import annotations

import os

from lathe.train.callbacks.events import TrainerCallback


class SaveProcessorCallback(TrainerCallback):
    def __init__(self, processor):
        self.processor = processor

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:
            self.processor.save_pretrained(os.path.join(args.output_dir, f"checkpoint-{state.global_step}"))

    def on_train_end(self, args, state, control, **kwargs):
        if args.should_save:
            self.processor.save_pretrained(args.output_dir)


def processor_callbacks(media, model) -> list:
    """[SaveProcessorCallback] for a vision-language model trained with a multimodal template, else []."""
    from lathe.llm.multimodal.towers import is_vision_language

    if media is None or not is_vision_language(model):
        return []
    return [SaveProcessorCallback(media.processor)]
