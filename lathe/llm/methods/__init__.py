"""The fine-tuning methods' parts of a recipe's Trainer: the optimizer mixin every recipe uses (optimizers.py:
GaLore, APOLLO, BAdam, Adam-mini, Muon, LoRA+ by LLaMA-Factory's keys), LoRA+'s parameter groups
(loraplus.py), the decay rule they share (decay.py, a leaf) and the SFT loss variants (losses.py). May import
lathe.train.optim, lathe.train.parallel, lathe.llm.config and lathe.llm.model; the recipes in
lathe.llm.workflows import this package."""
