"""What one argument switches on, each in its own module and the one importer of its optional package:
NEFTune noise (neftune.py), memory metrics with psutil (memory.py), hyperparameter search with optuna
(hp_search.py), the model card and the Hub entry points (hub.py). May import lathe.train.args only."""
