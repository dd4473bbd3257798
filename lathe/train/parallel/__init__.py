"""More than one process: torch.distributed helpers and gathers (distributed.py), FSDP2 (fsdp.py), and
DeepSpeed ZeRO with its checkpoint engine (deepspeed_zero.py, deepspeed_checkpoint.py; the one place
deepspeed is imported, besides deepspeed_ops.py reading which ops it was installed with to say what a first run
compiles), and quiet_collectives.py (torch's deprecation warnings for the collectives
DeepSpeed calls, silenced around lathe's calls into it only). May import lathe.train.checkpoints (the file format) only."""
