"""The `lathe train` recipes (pt.py, sft.py) and what they share: setup, the printed plan, the outputs."""
