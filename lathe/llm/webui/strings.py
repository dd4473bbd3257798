"""Every piece of text the page shows, by language: add a language by adding a dict with the same keys."""

from __future__ import annotations

ENGLISH = {
    "title": "lathe webui",
    "tab_train": "Train",
    "tab_watch": "Watch",
    "tab_chat": "Chat",
    "tab_export": "Export",
    "model": "Model folder or hub id",
    "template": "Template",
    "suggest": "Suggest from tokenizer",
    "no_suggestion": "no template reproduces the tokenizer's chat_template: type one",
    "stage": "Stage",
    "action": "Action",
    "action_train": "Train",
    "action_predict": "Evaluate & predict (datasets as eval_dataset)",
    "method": "Method",
    "dataset_dir": "Dataset folder",
    "dataset": "Datasets",
    "load_datasets": "Load dataset_info.json",
    "upload": "Upload a data file (into the dataset folder)",
    "output_dir": "Output folder",
    "hyper": "Hyperparameters",
    "all_keys": "All keys (YAML, win over the fields)",
    "trust_remote_code": "trust_remote_code (runs the model folder's Python code)",
    "confirm_remote_code": "Run trust_remote_code? It executes Python files from the model folder.",
    "preview": "Preview data",
    "plan": "Memory plan (dry run)",
    "yaml": "Resolved YAML",
    "start": "Start",
    "stop": "Stop",
    "resume": "Resume",
    "refresh": "Refresh",
    "runs": "Runs",
    "run": "Run",
    "status": "Status",
    "progress": "Progress",
    "loss": "Loss",
    "lr": "Learning rate",
    "grad_norm": "Grad norm",
    "reward": "Reward (GRPO, mean per step)",
    "eval_loss": "Eval loss",
    "tokens_per_second": "Tokens/s",
    "eta": "ETA",
    "log_tail": "Log",
    "compare": "Compare (side by side)",
    "load_model": "Load",
    "adapter": "Adapter folder(s)",
    "send": "Send",
    "clear": "Clear",
    "message": "Message",
    "export_dir": "Export folder",
    "export_size": "Shard size (GB)",
    "export_gguf": "GGUF for llama.cpp / Ollama (Ctrl-click for several)",
    "export": "Export",
    "files": "Files",
    "working": "Working...",
    "no_runs": "No runs under the root yet.",
    "error": "Error",
}

LANGUAGES = {"en": ENGLISH}


def strings(language: str | None = None) -> dict:
    """The page's text in `language`; keys it lacks fall back to English."""
    chosen = LANGUAGES.get(language or "en", ENGLISH)
    return {**ENGLISH, **chosen}


STRINGS = strings()
