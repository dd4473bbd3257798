"""Losses the Trainer computes itself: label smoothing (smoothing.py), the chunked cross-entropy that never
holds the full logits (chunked.py) and the causal-LM loss (causal_lm.py). May import lathe.train.data
(the ignored-label value) only."""
