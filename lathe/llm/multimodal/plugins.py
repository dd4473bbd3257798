"""Which multimodal family a template's `multimodal` name (LLaMA-Factory's mm_plugin) selects: one line per family,
"module:Class" of its FamilyPlugin (lathe.llm.multimodal.base). A family not listed is named in a clear error, never
trained as text with the media dropped."""

from __future__ import annotations

FAMILIES = {
    "qwen2_vl": "lathe.llm.multimodal.qwen2_vl:Qwen2VLPlugin",
    "qwen3_vl": "lathe.llm.multimodal.qwen3_vl:Qwen3VLPlugin",
    "llava": "lathe.llm.multimodal.llava:LlavaPlugin",
    "llava_next": "lathe.llm.multimodal.llava_next:LlavaNextPlugin",
    "llava_next_video": "lathe.llm.multimodal.llava_next_video:LlavaNextVideoPlugin",
    "video_llava": "lathe.llm.multimodal.video_llava:VideoLlavaPlugin",
    "gemma3": "lathe.llm.multimodal.gemma3:Gemma3Plugin",
    "gemma3n": "lathe.llm.multimodal.gemma3n:Gemma3nPlugin",
    "gemma4": "lathe.llm.multimodal.gemma4:Gemma4Plugin",
    "gemma4n": "lathe.llm.multimodal.gemma4n:Gemma4nPlugin",
    "paligemma": "lathe.llm.multimodal.paligemma:PaliGemmaPlugin",
    "qwen2_audio": "lathe.llm.multimodal.qwen2_audio:Qwen2AudioPlugin",
    "mllama": "lathe.llm.multimodal.mllama:MllamaPlugin",
    "pixtral": "lathe.llm.multimodal.pixtral:PixtralPlugin",
    "intern_vl": "lathe.llm.multimodal.intern_vl:InternVLPlugin",
    "glm4v": "lathe.llm.multimodal.glm4v:Glm4vPlugin",
    "qwen2_omni": "lathe.llm.multimodal.qwen2_omni:Qwen2OmniPlugin",
    "qwen3_omni": "lathe.llm.multimodal.qwen2_omni:Qwen3OmniPlugin",
    "kimi_vl": "lathe.llm.multimodal.kimi_vl:KimiVLPlugin",
    "llama4": "lathe.llm.multimodal.llama4:Llama4Plugin",
    "lfm2_vl": "lathe.llm.multimodal.lfm2_vl:Lfm2VlPlugin",
    "ernie_vl": "lathe.llm.multimodal.ernie_vl:ErnieVLPlugin",
    "minicpm_v": "lathe.llm.multimodal.minicpm_v:MiniCPMVPlugin",
    "minicpm_o": "lathe.llm.multimodal.minicpm_v:MiniCPMOPlugin",  # LLaMA-Factory's minicpm_v plugin with <audio>
    "youtu_vl": "lathe.llm.multimodal.youtu_vl:YoutuVLPlugin",
    "minicpm_v_4_6": "lathe.llm.multimodal.minicpm_v_4_6:MiniCPMV46Plugin",
}
IMPLEMENTED = {name: target.split(":")[0] for name, target in FAMILIES.items()}


def _unsupported(name: str, template_name: str) -> ValueError:
    what = f"template {template_name!r} (multimodal family {name!r})" if template_name else f"family {name!r}"
    return ValueError(
        f"{what}: image, video and audio input is not supported yet for this family "
        f"(lathe encodes: {', '.join(sorted(FAMILIES))})"
    )


def plugin_module(name: str, template_name: str = ""):
    """The module that encodes family `name`'s media; an error naming the family when lathe has none yet."""
    import importlib

    if name not in FAMILIES:
        raise _unsupported(name, template_name)
    return importlib.import_module(IMPLEMENTED[name])


def plugin_class(name: str, template_name: str = ""):
    module = plugin_module(name, template_name)
    return getattr(module, FAMILIES[name].split(":")[1])


def get_plugin(template, processor, tokenizer, settings=None):
    """The run's FamilyPlugin for `template` (its `multimodal` name), or an error when the template has none."""
    from lathe.llm.multimodal.base import MediaSettings

    name = getattr(template, "multimodal", "") or ""
    if not name:
        raise ValueError(
            f"template {getattr(template, 'name', '?')!r} takes no images, videos or audio: "
            "use the model family's multimodal template (e.g. qwen2_vl)"
        )
    plugin = plugin_class(name, getattr(template, "name", ""))(processor, tokenizer, settings or MediaSettings())
    plugin.check_settings()
    return plugin
