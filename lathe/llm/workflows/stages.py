"""Which recipe trains each `lathe train` stage: the stage -> workflow-module table, and run_train, which
hands a parsed config to its stage's recipe. Every recipe module has run(config, dry_run, callbacks)."""

from __future__ import annotations

from importlib import import_module

# stage -> module of lathe.llm.workflows (imported only when that stage runs: each pulls in transformers).
RECIPES = {
    "pt": "pt",
    "sft": "sft",
    "rm": "rm",
    "dpo": "preference",
    "kto": "preference",
    "grpo": "grpo",
    "rloo": "grpo",
}


def run_train(config, dry_run: bool = False, callbacks: list | None = None) -> dict:
    """Run the stage the config names (pt, sft, rm, dpo, kto or grpo); the metrics of what ran ({} for a dry run)."""
    from lathe.llm.templates.resolve import forget_chat_template_warnings

    forget_chat_template_warnings()  # the template-mismatch warning: once per run, not once per process
    stage = config.finetuning.stage
    if stage not in RECIPES:
        raise ValueError(f"stage {stage!r} has no recipe; lathe trains {', '.join(RECIPES)}.")
    from lathe.llm.workflows.rerun import finished_run_message

    finished = finished_run_message(config)
    if finished is not None:  # nothing is loaded and no file in output_dir is rewritten
        from lathe.llm.workflows.plan import print_once

        print_once(config, finished)
        return {}
    recipe = import_module(f"lathe.llm.workflows.{RECIPES[stage]}")
    if dry_run:
        return recipe.run(config, dry_run=dry_run, callbacks=callbacks)
    import os

    from lathe.llm.workflows.lock import OutputDirLock

    # one writer per output_dir (rank 0 holds it for the whole multi-process run)
    with OutputDirLock(config.training.output_dir, enabled=int(os.environ.get("RANK", "0")) == 0):
        return recipe.run(config, dry_run=dry_run, callbacks=callbacks)
