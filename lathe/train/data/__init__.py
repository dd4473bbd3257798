"""What reaches the model: the collators (collators.py, token_collators.py, masking.py, permutation.py, on
collator_base.py and padding.py), which columns the model takes (columns.py), the seeded, resumable
samplers (sampling.py), an epoch's batches skipped and read one ahead (epochs.py), the Trainer's dataloaders (loaders.py) and the ignored-label value (labels.py).
May import lathe.train.seed only; nothing here knows optimizers or checkpoints."""
