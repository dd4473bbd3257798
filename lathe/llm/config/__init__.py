"""A `lathe train` YAML file becomes one TrainConfig: parse_train_config and the argument dataclasses
(train.py), the sections and their keys (sections.py, keys.py), the value parsing and coercion (values.py),
the checks of methods, optimizers and stages (methods.py, optim.py, stages.py), the launchers' keys (launch.py)
and the preference keys (preference.py): config owns every key it checks. May import lathe.train.args
(TrainingArguments, HfArgumentParser), lathe.llm.strict_files, and lathe.llm.rl by one declared upward arrow
(grpo.py builds GRPOConfig at parse time to check its keys); the recipes, the launchers and the memory plan
import this package, not the other way.
The names below keep `from lathe.llm.config import parse_train_config` working."""

from lathe._lazy import make_getattr

_EXPORTS = {
    "DataArguments": "lathe.llm.config.train",
    "FinetuningArguments": "lathe.llm.config.train",
    "GeneratingArguments": "lathe.llm.config.train",
    "ModelArguments": "lathe.llm.config.train",
    "TrainConfig": "lathe.llm.config.train",
    "parse_overrides": "lathe.llm.config.train",
    "parse_train_config": "lathe.llm.config.train",
    "split_commas": "lathe.llm.config.train",
}
__all__ = sorted(_EXPORTS)
__getattr__ = make_getattr(__name__, _EXPORTS)
