"""The checkpoint file format: the checkpoint-N layout, written atomically and found again (layout.py),
weight files and shards (weights.py, shards.py), safe loading (loading.py), rotation (rotation.py), and the
background publication of a copy of the state (snapshot.py, commit.py). What the Trainer puts into a
checkpoint and takes back is saving.py and resume.py one level up. May import lathe.train.seed only."""
