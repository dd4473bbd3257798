"""A model folder's own code (transformers' remote code: `auto_map` in its config files names Python files beside
the weights), as one clear line when it cannot run: lathe.llm.model's loader and lathe.llm.multimodal's processor
loading both read it (so it sits beside them, not inside either)."""

from __future__ import annotations

import os
import re


def remote_code_error(error: Exception, folder: str, part: str) -> ValueError | None:
    """transformers' errors about a model folder's own code, as one line (theirs span several and name the Python
    argument): the folder's `auto_map` names code that runs only with trust_remote_code, or config.json's model_type
    is not in transformers and the folder names no code of its own (MiniCPM-V's model is openbmb's
    modeling_minicpmv.py in its repository). None for other errors."""
    text = str(error)
    if "trust_remote_code" in text:
        return ValueError(
            f"{folder}: the {part} is the model folder's own code (auto_map in its config files): set "
            "trust_remote_code: true to run it"
        )
    unknown = re.search(r"model type `([^`]+)` but Transformers does not recognize", text)
    if unknown:
        import transformers

        return ValueError(
            f"{os.path.join(folder, 'config.json')}: model_type {unknown.group(1)!r} is not in transformers "
            f"{transformers.__version__} and the folder names no code of its own (auto_map): copy the model's code "
            "files from its repository into the folder (e.g. MiniCPM-V's configuration_minicpm.py and "
            "modeling_minicpmv.py) and set trust_remote_code: true"
        )
    return None
