"""Static rules that decide which transformers Trainer tests measure public behaviour (bench/hf_trainer_tests.py).

A test that passes on transformers is left out of the public-behaviour count when its own code
  1. reaches into a private name: it reads, writes, mocks or patches an attribute or name with one leading
     underscore on anything but the test case itself (`trainer._train_batch_size`, `args._n_gpu`,
     `patch.object(trainer, "_evaluate")`, `control._new_step()`; private attributes of torch modules,
     optimizers, schedulers and tokenizers do not count, nor argparse's `_actions` list, which is what an
     HfArgumentParser accepts on the command line), or
  2. reaches into accelerate: it uses an `accelerator` attribute (`trainer.accelerator.unwrap_model`) or imports
     accelerate, or
  3. never names anything that the swap replaces (it tests transformers modules outside the Trainer side, e.g.
     reporter integrations), so it says nothing about lathe.
"Its own code" is the test method, the test case's helper methods it calls through `self`, and (for rule 3
only) the functions and classes of the test file and of trainer_test_utils.py that it calls, transitively.
"""

import ast
from pathlib import Path

PRIVATE = "private helper"
ACCELERATE = "accelerate internals"
NOT_TRAINER_SIDE = "does not use a replaced name"
# Private attributes of torch modules, optimizers, schedulers and tokenizers are not the Trainer's: a test that reads
# `trainer.lr_scheduler._last_lr` or `model...._forward_hooks` still measures Trainer behaviour.
NOT_TRAINER_OWNERS = ("lr_scheduler", "optimizer", "model", "tokenizer", "embeddings")
# argparse's own list of actions: HfArgumentParser is an argparse.ArgumentParser, and its actions (option strings,
# types, defaults, choices) are exactly what its command line accepts, so comparing them is public behaviour.
PUBLIC_ANYWAY = {"_actions"}


def _is_private(name):
    return name.startswith("_") and not name.startswith("__")


class _Index:
    """Module-level functions/classes and class methods of the files a test can reach."""

    def __init__(self, trees):
        self.functions = {}
        self.classes = {}
        for tree in trees:
            for node in tree.body:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self.functions[node.name] = node
                elif isinstance(node, ast.ClassDef):
                    self.classes[node.name] = node
                elif isinstance(node, ast.If):  # `if is_torch_available():` blocks of trainer_test_utils
                    for inner in node.body:
                        if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef)):
                            self.functions[inner.name] = inner
                        elif isinstance(inner, ast.ClassDef):
                            self.classes[inner.name] = inner

    def methods(self, class_name, seen=None):
        """Methods of a class and of its bases found in the index (name -> node)."""
        seen = seen or set()
        node = self.classes.get(class_name)
        if node is None or class_name in seen:
            return {}
        seen.add(class_name)
        found = {}
        for base in node.bases:
            if isinstance(base, ast.Name):
                found.update(self.methods(base.id, seen))
        found.update({n.name: n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})
        return found


def _own_code(index, class_name, method_name):
    """The test method plus the helper methods of its test case it calls through self (transitively)."""
    methods = index.methods(class_name) if class_name else {}
    start = methods.get(method_name) if class_name else index.functions.get(method_name)
    if start is None:
        return []
    nodes, todo, seen = [], [start], set()
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        nodes.append(node)
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
                and sub.attr in methods
            ):
                todo.append(methods[sub.attr])
    return nodes


def _reachable_names(index, nodes):
    """Every identifier the given code and the indexed functions/classes it names mention, transitively."""
    names, todo, seen = set(), list(nodes), set()
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                names.add(sub.id)
                target = index.functions.get(sub.id) or index.classes.get(sub.id)
                if target is not None:
                    todo.append(target)
            elif isinstance(sub, ast.Attribute):
                names.add(sub.attr)
    return names


def _private_or_accelerate(nodes):
    """The first rule-1 or rule-2 reason found in the test's own code, with the offending expression."""
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute):
                owner = sub.value.id if isinstance(sub.value, ast.Name) else None
                if owner in ("self", "cls"):
                    continue
                if sub.attr == "accelerator":
                    return ACCELERATE, f"uses .accelerator ({ast.unparse(sub)[:80]})"
                if (
                    _is_private(sub.attr)
                    and sub.attr not in PUBLIC_ANYWAY
                    and not any(k in ast.unparse(sub.value) for k in NOT_TRAINER_OWNERS)
                ):
                    return PRIVATE, f"uses {ast.unparse(sub)[:80]}"
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                module = getattr(sub, "module", None) or ""
                if module.startswith("accelerate") or any(a.name.startswith("accelerate") for a in sub.names):
                    return ACCELERATE, "imports accelerate"
            elif isinstance(sub, ast.Call):
                callee = ast.unparse(sub.func)
                if callee.endswith(("patch.object", "patch")) or callee == "patch":
                    for argument in sub.args:
                        if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                            if _is_private(argument.value.rsplit(".", 1)[-1]):
                                return PRIVATE, f"patches {argument.value}"
    return None


def classify(tests_root, nodeids, replaced_names):
    """nodeid -> (category or None for public behaviour, reason)."""
    tests_root = Path(tests_root)
    utils = ast.parse((tests_root / "tests/trainer/trainer_test_utils.py").read_text())
    parsed = {}
    result = {}
    for nodeid in nodeids:
        path, _, rest = nodeid.partition("::")
        parts = rest.split("::")
        class_name, method = (parts[0], parts[1]) if len(parts) == 2 else (None, parts[0])
        method = method.split("[")[0]
        if path not in parsed:
            parsed[path] = ast.parse((tests_root / path).read_text())
        index = _Index([utils, parsed[path]])
        if class_name and class_name not in index.classes:  # parameterized.expand renames: test_x_0_name
            pass
        methods = index.methods(class_name) if class_name else index.functions
        if method not in methods:  # parameterized.expand: test_bnb_optim_0_rmsprop_bnb -> test_bnb_optim
            candidates = [m for m in methods if method.startswith(m + "_")]
            method = max(candidates, key=len) if candidates else method
        nodes = _own_code(index, class_name, method)
        reason = _private_or_accelerate(nodes)
        if reason is None and not (_reachable_names(index, nodes) & replaced_names):
            reason = (NOT_TRAINER_SIDE, "names nothing the swap replaces")
        result[nodeid] = reason or (None, "")
    return result
