"""lathe.llm multimodal: images (and later videos, audio) beside the text, as LLaMA-Factory's plugins encode them.

- images.py: reading an image named by a data row (paths under media_dir, URLs refused offline), the
  pixel budget resize every family shares, and the placeholder count check.
- qwen2_vl.py: the Qwen2-VL / Qwen2.5-VL family: `<image>` expanded to its vision tokens, the image
  processor's tensors, and the 3-D (mrope) position ids the model's get_rope_index gives.
- plugins.py: which family a template's `multimodal` name selects; a family not implemented yet is a clear error.
"""
