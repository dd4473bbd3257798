"""lathe.llm multimodal: images (and videos, audio) beside the text, as LLaMA-Factory 0.9.5's mm plugins encode them.

The interface (base.py) that the data pipeline, the collator and the model setup call; a family is ONE module
that defines a `FamilyPlugin` subclass and is registered by one line in plugins.py (`FAMILIES`: the template's
`multimodal` name -> "module:Class"):

    plugin = plugins.get_plugin(template, processor, tokenizer, MediaSettings.from_args(model_args))
    plugin.check_settings()                                 # family-only keys (pan and scan, crop_to_patches)
    plugin.check_kinds({"image": 2}, where)                 # a kind the family lacks: one line naming the row
    media = {"image": plugin.regularize("image", paths, where)}      # opened, fitted into the pixel budget
    messages = plugin.process_messages(messages, media)     # <image> -> the family's vision tokens
    plugin.prefix_length(media)                             # tokens put before the row, within cutoff_len
    input_ids, labels = plugin.process_token_ids(input_ids, labels, media)
    plugin.cut_reason(input_ids, media)                     # a cutoff through a media run: the row is left out
    batch.update(plugin.batch_inputs(media_rows, batch, model, row_ids))  # pixel_values, grids, position ids, ...
    plugin.stand_in()                                       # a batch lacking a kind gets it (LF's fake media)
    plugin.composite(model_type)                            # Composite: vision / projector / language name parts

- base.py: MediaSettings (image_max_pixels ... audio_sampling_rate), Composite, FamilyPlugin.
- images.py: reading an image named by a data row (paths under media_dir, URLs refused offline), the pixel
  budget resize every family shares, the placeholder count check, media_cut_reason.
- media.py: the rows' media columns: paths joined to media_dir as LLaMA-Factory does, checked per row.
- encode.py: MediaEncoder, the data pipeline's handle on the run's plugin (the processor loaded at the first row
  with media), and the tokenized rows' media columns.
- qwen2_vl.py: the Qwen2-VL / Qwen2.5-VL family (images, videos); mrope.py: its mrope position ids from the model's
  get_rope_index (padded batches; packed rows, one packed example at a time); qwen3_vl.py: Qwen3-VL on top of it
  (videos as timestamped runs per temporal patch).
- glm4v.py (GLM-4.1V) and qwen2_omni.py (Qwen2.5-Omni / Qwen3-Omni: images, audio, videos, use_audio_in_video):
  Qwen2VLPlugin's subclasses with their own tokens and the model's mrope positions.
- video.py: videos read with PyAV as LLaMA-Factory samples them (video_fps, video_maxlen), their timing.
- llava.py, llava_next.py, llava_next_video.py, video_llava.py, gemma3.py, gemma3n.py, gemma4.py (gemma4n.py: its
  template with audio), paligemma.py, qwen2_audio.py, mllama.py, pixtral.py, intern_vl.py, kimi_vl.py, llama4.py,
  lfm2_vl.py, youtu_vl.py, minicpm_v_4_6.py: the other families (placeholder
  expansion, PaliGemma's image prefix, their tensors), each a FamilyPlugin through common.py's ModulePlugin (the
  media settings, image processor / video processor / feature extractor calls); minicpm_v.py: MiniCPM-V / MiniCPM-o
  on the model folder's own processor (trust_remote_code), their batch nested in the `data` dict the model takes.
- collator.py: the collator for any family: the text collator's padding, then the plugin's tensors.
- towers.py: freeze_vision_tower / freeze_multi_modal_projector / freeze_language_model, LoRA targets.
- plugins.py: the registry; a family not implemented yet is a clear error, never trained as text.
"""
