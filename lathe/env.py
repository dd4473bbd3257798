"""`lathe env`: the facts a bug report needs (versions, devices)."""

from __future__ import annotations

import importlib.metadata
import platform

OPTIONAL_PACKAGES = (
    "transformers",
    "tokenizers",
    "peft",
    "datasets",
    "safetensors",
    "accelerate",
    "fastapi",
    "uvicorn",
    "matplotlib",
    "tensorboard",
    "wandb",
    "mlflow",
    "mlflow-skinny",
    "trackio",
    "optuna",
)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def describe() -> str:
    import torch

    import lathe

    lines = [
        f"lathe: {lathe.__version__}",
        f"python: {platform.python_version()} ({platform.platform()})",
        f"torch: {torch.__version__}",
    ]
    lines += [f"{name}: {_version(name)}" for name in OPTIONAL_PACKAGES]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            lines.append(f"device {index}: {torch.cuda.get_device_name(index)}")
    else:
        lines.append(f"devices: cpu ({torch.get_num_threads()} threads), no CUDA")
    return "\n".join(lines)
