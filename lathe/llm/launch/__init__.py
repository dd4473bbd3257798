"""Starting and stopping a `lathe train` run: relaunching the command under torchrun when several processes are
asked for (torchrun.py), the Ray keys read and checked for USE_RAY=1 (ray_settings.py) and Ray Train's driver
and workers (ray_train.py), Ctrl-C / SIGTERM finishing the step and saving a checkpoint (stopping.py), and the start-up's imports
without the garbage collector's full scans (startup.py).
The keys' names and their parse-time checks are lathe.llm.config.launch; the run itself is
lathe.llm.workflows. May import lathe.llm.config, lathe.llm.hub, lathe.llm.workflows and lathe.train."""
