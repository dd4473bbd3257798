"""lathe.llm multimodal: images (and later videos, audio) beside the text, as LLaMA-Factory's plugins encode them.

- images.py: reading an image named by a data row (paths under media_dir, URLs refused offline), the
  pixel budget resize every family shares, and the placeholder count check.
- qwen2_vl.py: the Qwen2-VL / Qwen2.5-VL family: `<image>` expanded to its vision tokens, the image
  processor's tensors, the 3-D (mrope) position ids the model's get_rope_index gives, which towers full
  tuning freezes and which modules LoRA may wrap.
- llava.py, llava_next.py, gemma3.py, gemma3n.py, paligemma.py, qwen2_audio.py, mllama.py, pixtral.py,
  intern_vl.py: the other families (placeholder expansion, PaliGemma's image prefix, the collator's tensors), on
  common.py: the media settings, the image processor / feature extractor calls and their collator (FamilyCollator).
- collator.py: the sft collator for the family's rows (LLaMA-Factory's stand-in image for image-less batches).
- plugins.py: which family a template's `multimodal` name selects; a family not implemented yet is a clear error.
"""
