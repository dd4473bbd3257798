"""GRPO's environments, as TRL 1.16's `environment_factory` defines them: a class (or callable) whose instances
have `reset(**row)` (called with the dataset row before each rollout; a returned string is appended to the
prompt's last message) and public methods the model calls as tools; an optional `get_reward()` makes the
environment a reward source (weight 1, named after the class). One instance per rollout, pooled and reset
across batches (constructed once, reset often). A dict {name: factory} picks each row's environment by its
`environment` column, and only that environment's tools are in its prompt."""

from __future__ import annotations

import inspect


def _methods(environment) -> tuple[list, bool, bool]:
    """The environment's tool methods (public functions of its class but reset and get_reward), and whether
    it has reset and get_reward. Listed on the class: listing the instance would evaluate its properties."""
    methods, has_reset, has_reward = [], False, False
    for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction):
        if name == "reset":
            has_reset = True
        elif name == "get_reward":
            has_reward = True
        elif not name.startswith("_"):
            methods.append(getattr(environment, name))
    return methods, has_reset, has_reward


def _reward_of(environment_type):
    """A reward function scoring the rollouts whose environment is exactly `environment_type` (None for the
    others: NaN, left out of the means)."""

    def get_reward(environments, **kwargs):
        return [e.get_reward() if type(e) is environment_type else None for e in environments]

    get_reward.__name__ = environment_type.__name__
    return get_reward


class Environments:
    """The factories, each environment's tools, and the pool of instances."""

    def __init__(self, factory, standalone_tools):
        self.multiple = isinstance(factory, dict)
        self.factories = factory if self.multiple else {None: factory}
        self.standalone_tools = list(standalone_tools)
        self.tools_by_environment, self.pool, self.reward_functions = {}, {}, []
        rewarded = []
        for name, make in self.factories.items():
            if not callable(make):
                raise ValueError(f"environment_factory{f'[{name!r}]' if name else ''}: {make!r} is not callable.")
            instance = make()
            methods, has_reset, has_reward = _methods(instance)
            if not has_reset:
                raise ValueError(
                    f"environment_factory: {type(instance).__name__} has no `reset` method; each environment needs "
                    "reset(**row), called before every rollout."
                )
            self.tools_by_environment[name] = self.standalone_tools + methods
            self.pool[name] = [instance]
            if has_reward and type(instance) not in rewarded:  # one reward source per class
                rewarded.append(type(instance))
                self.reward_functions.append(_reward_of(type(instance)))

    def all_tools(self) -> list:
        """Every tool any environment exposes (the standalone ones first), each once."""
        tools = list(self.standalone_tools)
        for methods in self.tools_by_environment.values():
            tools += [m for m in methods if m not in tools]
        return tools

    def names_of(self, rows, row_ids) -> list:
        if not self.multiple:
            return [None] * len(rows)
        names = []
        for row, index in zip(rows, row_ids):
            name = row.get("environment")
            if name not in self.factories:
                raise ValueError(
                    f"dataset row {index}: environment={name!r} is not among environment_factory's environments "
                    f"({', '.join(map(str, self.factories))})."
                )
            names.append(name)
        return names

    def instances_for(self, names) -> list:
        """One instance per rollout, drawn from each environment's pool (which grows only when a batch needs
        more instances of it than it holds)."""
        taken, instances = {}, []
        for name in names:
            pool, index = self.pool[name], taken.get(name, 0)
            if index == len(pool):
                pool.append(self.factories[name]())
            taken[name] = index + 1
            instances.append(pool[index])
        return instances

    def tools_by_name(self, environment) -> dict:
        methods, _, _ = _methods(environment)
        return {tool.__name__: tool for tool in self.standalone_tools + methods}

    def reset(self, instances, prompts, rows) -> list:
        """Each instance reset with its row (without the `environment` column under a dict); a returned
        observation is appended to the last message of the prompt (a new list: the row is left as it is)."""
        prompts = list(prompts)
        for i, (environment, row) in enumerate(zip(instances, rows)):
            # lathe's rendered prompt_ids are not a dataset column; under a dict, `environment` picks, not resets.
            skipped = ("prompt_ids", "environment") if self.multiple else ("prompt_ids",)
            arguments = {k: v for k, v in row.items() if k not in skipped}
            observation = environment.reset(**arguments)
            if observation is None:
                continue
            last = prompts[i][-1]
            content = last["content"]
            if isinstance(observation, list) and isinstance(content, str):
                content = [{"type": "text", "text": content}]
            if isinstance(observation, str) and isinstance(content, list):
                observation = [{"type": "text", "text": observation}]
            prompts[i] = prompts[i][:-1] + [{**last, "content": content + observation}]
        return prompts
