"""The gemma4n template's family: Gemma 4 (gemma4.py) with audio, as LLaMA-Factory 0.9.5 registers the template
(its gemma4 plugin with audio_token `<|audio|>`): `<audio>` becomes `<|audio>` + `<|audio|>` per audio-encoder frame +
`<audio|>`, and the collator adds input_features and input_features_mask (a batch without audio gets the stand-in
silence)."""

from __future__ import annotations

from lathe.llm.multimodal.gemma4 import (  # noqa: F401 (the family's functions, read by ModulePlugin)
    COMPOSITES,
    IMAGE_TOKEN,
    VIDEO_TOKEN,
    Gemma4Plugin,
    media_inputs,
    media_tokens,
    prefix_ids,
    process_messages,
)

AUDIO_TOKEN = "<|audio|>"


class Gemma4nPlugin(Gemma4Plugin):
    """LLaMA-Factory's Gemma 4 plugin as the gemma4n template makes it (images, videos and audio)."""

    name = "gemma4n"
    missing = {}
