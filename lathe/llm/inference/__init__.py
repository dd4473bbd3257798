"""Serving what was trained: the inference config, loading, generation (lathe chat, lathe api) and export."""
