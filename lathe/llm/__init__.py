"""lathe.llm: the LLaMA-Factory-style workflow (`lathe train|chat|api|export`) on lathe.train; never imported by it.
The commands (commands.py, export.py) sit at this level, with two leaves (hub.py: model ids to folders;
strict_files.py); from the top down: webui/, inference/ (chat and the API) and launch/ (starting and stopping
a run), workflows/ (the recipes, one per stage), preference/ (dpo, kto, rm trainers), methods/ (the methods'
optimizers, losses and token meter) and rl/ (GRPO), data/ (datasets -> tokenized rows), memory/ (the memory
plan), model/ (loading, adapters, the frozen reference copy), multimodal/, templates/ (chat formats) and
config/ (a YAML file -> a TrainConfig, with every key it checks)."""
