"""Module paths lathe had before its folders by concern, each imported as the module that took its place: a
training_args.bin pickled before the move names lathe.train.args_enums, lathe.train.args_integrations, ...,
and a script may still import an old path. Installed by `import lathe`; lathe's own code uses the new paths."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys

MOVED = {
    "lathe.train.args_core": "lathe.train.args.training_args",
    "lathe.train.args_deprecated": "lathe.train.args.deprecated",
    "lathe.train.args_derived": "lathe.train.args.derived",
    "lathe.train.args_enums": "lathe.train.args.enums",
    "lathe.train.args_integrations": "lathe.train.args.integrations",
    "lathe.train.args_setters": "lathe.train.args.setters",
    "lathe.train.args_types": "lathe.train.args.coercion",
    "lathe.train.args_validation": "lathe.train.args.validation",
    "lathe.train.argparser": "lathe.train.args.parser",
    "lathe.train.argparser_types": "lathe.train.args.parser_types",
    "lathe.train.loaders": "lathe.train.data.loaders",
    "lathe.train.columns": "lathe.train.data.columns",
    "lathe.train.collator_base": "lathe.train.data.collator_base",
    "lathe.train.collators": "lathe.train.data.collators",
    "lathe.train.token_collators": "lathe.train.data.token_collators",
    "lathe.train.masking": "lathe.train.data.masking",
    "lathe.train.padding": "lathe.train.data.padding",
    "lathe.train.permutation": "lathe.train.data.permutation",
    "lathe.train.labels": "lathe.train.data.labels",
    "lathe.train.checkpoint": "lathe.train.checkpoints.layout",
    "lathe.train.shards": "lathe.train.checkpoints.shards",
    "lathe.train.loading": "lathe.train.checkpoints.loading",
    "lathe.train.weights": "lathe.train.checkpoints.weights",
    "lathe.train.rotation": "lathe.train.checkpoints.rotation",
    "lathe.train.commit": "lathe.train.checkpoints.commit",
    "lathe.train.snapshot": "lathe.train.checkpoints.snapshot",
    "lathe.train.flow": "lathe.train.callbacks.flow",
    "lathe.train.debug": "lathe.train.callbacks.debug",
    "lathe.train.jit_checkpoint": "lathe.train.callbacks.jit_checkpoint",
    "lathe.train.integrations": "lathe.train.callbacks.reporters",
    "lathe.train.integrations.jsonl": "lathe.train.callbacks.reporters.jsonl",
    "lathe.train.integrations.kubeflow": "lathe.train.callbacks.reporters.kubeflow",
    "lathe.train.integrations.mlflow_reporter": "lathe.train.callbacks.reporters.mlflow",
    "lathe.train.integrations.tensorboard": "lathe.train.callbacks.reporters.tensorboard",
    "lathe.train.integrations.trackio_reporter": "lathe.train.callbacks.reporters.trackio",
    "lathe.train.integrations.wandb_reporter": "lathe.train.callbacks.reporters.wandb",
    "lathe.train.chunked_loss": "lathe.train.loss.chunked",
    "lathe.train.causal_lm": "lathe.train.loss.causal_lm",
    "lathe.train.predicting": "lathe.train.evaluation.predicting",
    "lathe.train.results": "lathe.train.evaluation.results",
    "lathe.train.outputs": "lathe.train.evaluation.outputs",
    "lathe.train.schedules": "lathe.train.optim.schedules",
    "lathe.train.named_schedules": "lathe.train.optim.named_schedules",
    "lathe.train.greedy": "lathe.train.optim.greedy",
    "lathe.train.adafactor": "lathe.train.optim.adafactor",
    "lathe.train.layerwise": "lathe.train.optim.layerwise",
    "lathe.train.muon": "lathe.train.optim.muon",
    "lathe.train.integrations.galore": "lathe.train.optim.galore",
    "lathe.train.integrations.apollo": "lathe.train.optim.apollo",
    "lathe.train.integrations.badam": "lathe.train.optim.badam",
    "lathe.train.integrations.adam_mini": "lathe.train.optim.adam_mini",
    "lathe.train.distributed": "lathe.train.parallel.distributed",
    "lathe.train.fsdp": "lathe.train.parallel.fsdp",
    "lathe.train.integrations.deepspeed_zero": "lathe.train.parallel.deepspeed_zero",
    "lathe.train.integrations.deepspeed_checkpoint": "lathe.train.parallel.deepspeed_checkpoint",
    "lathe.train.neftune": "lathe.train.features.neftune",
    "lathe.train.memory": "lathe.train.features.memory",
    "lathe.train.hp_search": "lathe.train.features.hp_search",
    "lathe.train.hub": "lathe.train.features.hub",
    "lathe.llm.config_keys": "lathe.llm.config.keys",
    "lathe.llm.config_methods": "lathe.llm.config.methods",
    "lathe.llm.config_optim": "lathe.llm.config.optim",
    "lathe.llm.config_sections": "lathe.llm.config.sections",
    "lathe.llm.config_stages": "lathe.llm.config.stages",
    "lathe.llm.config_values": "lathe.llm.config.values",
    "lathe.llm.memory_fit": "lathe.llm.memory.fit",
    "lathe.llm.memory_layers": "lathe.llm.memory.layers",
    "lathe.llm.memory_plan": "lathe.llm.memory.plan",
    "lathe.llm.memory_precision": "lathe.llm.memory.precision",
    "lathe.llm.memory_preference": "lathe.llm.memory.preference",
    "lathe.llm.memory_sharding": "lathe.llm.memory.sharding",
    "lathe.llm.loraplus": "lathe.llm.methods.loraplus",
    "lathe.llm.workflows.optimizers": "lathe.llm.methods.optimizers",
    "lathe.llm.workflows.losses": "lathe.llm.methods.losses",
}


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path first (before the file search) and loads the new module in its place."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        # The import system returns whatever sys.modules holds after exec_module: the moved module itself, so
        # classes keep one identity (isinstance, pickle) and the new module's spec is left untouched.
        sys.modules[module.__name__] = importlib.import_module(MOVED[module.__name__])


def install() -> None:
    """Put the finder in front of the file search, once."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
