"""The PaliGemma family (paligemma, paligemma_chat templates) as LLaMA-Factory 0.9.5 encodes images: the
`<image>` placeholders are removed from the text and image_seq_length `<image>` tokens per image go before
everything, BOS included (labels -100). The collator adds pixel_values and token_type_ids: 0 on the first
(images x image_seq_length) positions of each row, 1 after (LLaMA-Factory's variant: the prompt counts as 1,
so the model's prefix attention covers the images only)."""

from __future__ import annotations

from lathe.llm.multimodal.common import MediaSettings, ModulePlugin, composite, image_processor_inputs, placeholder_runs
from lathe.llm.multimodal.images import IMAGE_PLACEHOLDER

IMAGE_TOKEN, AUDIO_TOKEN = "<image>", None
COMPOSITES = {"paligemma": composite()}  # as LLaMA-Factory registers them


def process_messages(messages, images, audios, processor, settings: MediaSettings) -> list[dict]:
    """The messages without their `<image>` placeholders (the images go in front: prefix_ids)."""
    return placeholder_runs(messages, IMAGE_PLACEHOLDER, lambda k: "")


def media_tokens(processor) -> tuple[str, ...]:
    return ()  # the image prefix goes in front and is never cut


def prefix_ids(images, tokenizer, processor) -> list[int]:
    """image_seq_length image tokens per image: the row's first tokens (never trained, never cut by cutoff_len:
    LLaMA-Factory counts them against the budget first)."""
    return [tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)] * (len(images) * processor.image_seq_length)


def token_type_ids(counts: list[int], lengths: list[int], image_seq_length: int) -> list[list[int]]:
    return [
        [0] * (count * image_seq_length) + [1] * (length - count * image_seq_length)
        for count, length in zip(counts, lengths)
    ]


def media_inputs(images, audios, counts, batch_ids, processor, settings: MediaSettings) -> dict:
    """pixel_values of the batch's images and the rows' token_type_ids."""
    inputs = image_processor_inputs(images, processor, settings)
    lengths = [len(ids) for ids in batch_ids]
    inputs["token_type_ids"] = token_type_ids(counts["image"], lengths, processor.image_seq_length)
    return inputs


class PaliGemmaPlugin(ModulePlugin):
    """LLaMA-Factory's PaliGemma plugin: the functions above as the pipeline's FamilyPlugin steps."""

    name = "paligemma"
