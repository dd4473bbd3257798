"""The fine-tuning methods' parts of a recipe's Trainer: the optimizer mixin every recipe uses (optimizers.py:
GaLore, APOLLO, BAdam, Adam-mini, Muon, LoRA+ by LLaMA-Factory's keys), LoRA+'s parameter groups
(loraplus.py), the decay rule they share (decay.py, a leaf), the SFT loss variants (losses.py) and the token
meter every recipe's Trainer mixes in (meter.py). May import lathe.train and lathe.llm.model; the recipes in
lathe.llm.workflows and the trainers in lathe.llm.preference import this package."""
