"""A stand-in for torchvision, for bench/example_scripts.py: only `torchvision.transforms` (run_image_classification).

The torchvision wheels on PyPI are built against CUDA torch and their compiled ops fail to load beside the local
CPU torch (docs: /work/shared/PEERS.md, "Vision"); bench/example_shim.py puts this folder first on sys.path for both
Trainers, so both get the same transforms.
"""
