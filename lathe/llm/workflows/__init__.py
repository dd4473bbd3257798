"""The `lathe train` recipes, one module per stage (stages.py says which: pt.py, sft.py, rm.py,
preference.py for dpo and kto), and what they share: setup, the printed plan, the outputs."""
