"""lathe.llm: the LLaMA-Factory-style workflow (`lathe train|chat|api|export`) on lathe.train; never imported by it.
The commands (commands.py, launch.py, export.py) sit at this level; below them config/ (a YAML file -> a
TrainConfig), data/ (datasets -> tokenized rows), model/ (loading, adapters), templates/ (chat formats),
methods/ (the methods' optimizers and losses), preference/ (dpo, kto, rm trainers), memory/ (the memory plan),
inference/ (chat and the API) and workflows/ (the recipes, one per stage)."""
