"""Which multimodal family a template's `multimodal` name (LLaMA-Factory's mm_plugin) selects: one line per family
(qwen2_vl.py has its own shape; the others follow common.py's). A family not listed is named in a clear error,
never trained as text with the media dropped."""

from __future__ import annotations

IMPLEMENTED = {
    "qwen2_vl": "lathe.llm.multimodal.qwen2_vl",
    "llava": "lathe.llm.multimodal.llava",
    "llava_next": "lathe.llm.multimodal.llava_next",
    "gemma3": "lathe.llm.multimodal.gemma3",
    "paligemma": "lathe.llm.multimodal.paligemma",
    "qwen2_audio": "lathe.llm.multimodal.qwen2_audio",
    "mllama": "lathe.llm.multimodal.mllama",
    "pixtral": "lathe.llm.multimodal.pixtral",
    "intern_vl": "lathe.llm.multimodal.intern_vl",
    "gemma3n": "lathe.llm.multimodal.gemma3n",
}


def plugin_module(name: str, template_name: str = ""):
    """The module that encodes family `name`'s media; an error naming the family when lathe has none yet."""
    import importlib

    if name not in IMPLEMENTED:
        what = f"template {template_name!r} (multimodal family {name!r})" if template_name else f"family {name!r}"
        raise ValueError(
            f"{what}: image, video and audio input is not supported yet for this family "
            f"(lathe encodes: {', '.join(sorted(IMPLEMENTED))})"
        )
    return importlib.import_module(IMPLEMENTED[name])
