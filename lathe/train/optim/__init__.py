"""Optimizers and learning-rate schedules: the Trainer's optimizer and its weight-decay groups
(optimizers.py), the schedules get_scheduler builds (schedules.py, named_schedules.py, greedy.py),
Adafactor, layer-wise updates and Muon, and one module per optional optimizer package (galore.py,
apollo.py, badam.py, adam_mini.py). May import nothing else of lathe.train."""
