"""Model loading and fine-tuning methods (full, freeze, lora)."""
