"""The memory plan (printed by `lathe train` and `--dry_run`, docs/MEMORY.md): what a run will hold on each
device, estimated from the model's shapes before any weight is loaded (plan.py), by layer and adapter
(layers.py), dtype and quantisation (precision.py), preference training's reference model and pairs
(preference.py), ZeRO and FSDP sharding (sharding.py), the byte counts they share (sizes.py, a leaf), and
the advice when it does not fit (fit.py). May import lathe.train's parallel and loss modules for their
numbers; nothing here trains."""
