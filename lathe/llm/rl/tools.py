"""Tool calling in GRPO, as TRL 1.16's GRPOTrainer(tools=..., environment_factory=...) does it: the prompts are
rendered with the tools' JSON schemas; each sampled completion is parsed for tool calls; the called tools run
and their results are appended in the template's tool-response format, and the model samples again from there
(at most max_tool_calling_iterations times). The completion is everything after the prompt (the model's turns
and the tool results); the tool results' tokens get tool_mask 0 and add no loss. The reward functions see
each completion as its messages: [assistant (with tool_calls), tool, ..., assistant].

Two renderings: the tokenizer's chat template (TRL's: the tools given to `apply_chat_template`, and a tool
response's tokens found as the difference of two renderings of a dummy exchange), or a lathe Template (`template:`
in `lathe train`: the tools described by its tool_format, a tool response in its observation slots).
Tool calls are read back with a lathe tool format (lathe.llm.templates.tools): the template's, or for the chat
template path the one its tool-call markers name (or `tool_format`)."""

from __future__ import annotations

import json

from lathe.llm.rl import generation
from lathe.llm.rl.tool_parsing import call_tools, guess_tool_format, parse_completion, tool_schemas


def resolve_tools(specs, search_dirs=()) -> list:
    """Callables for `tools`: callables or `module:function` names (imported as reward functions are)."""
    from lathe.llm.rl.rewards import resolve_reward_function

    tools = []
    for spec in specs or []:
        if isinstance(spec, str) and ":" not in spec:
            raise ValueError(f"tools: {spec!r} is not 'module:function' (e.g. 'tools:add').")
        tools.append(spec if callable(spec) else resolve_reward_function(spec, search_dirs))
    return tools


class ChatTemplateRendering:
    """TRL's rendering: the tokenizer's chat template with the tools (callables) it is given."""

    def __init__(self, tokenizer, chat_template_kwargs=None, tool_format=None):
        self.tokenizer = tokenizer
        self.kwargs = chat_template_kwargs or {}
        self.tool_format = tool_format or guess_tool_format(tokenizer)
        self._check_prefix_preserving()

    def prompt_ids(self, prompt, tools) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(
            conversation=[prompt],
            tools=tools or None,  # None, not []: some templates write their tool preamble for an empty list
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **self.kwargs,
        )
        return list(encoded["input_ids"][0])

    def _render(self, messages, add_generation_prompt: bool) -> list[int]:
        return list(
            self.tokenizer.apply_chat_template(
                messages,
                add_generation_prompt=add_generation_prompt,
                tokenize=True,
                return_dict=False,
                **self.kwargs,
            )
        )

    def _dummy_exchange(self, name: str) -> list[dict]:
        call = {"type": "function", "function": {"name": name, "arguments": {}}}
        return [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]

    def _check_prefix_preserving(self) -> None:
        """The chat template renders a tool call and a tool result (TRL's supports_tool_calling), and renders the
        earlier turns the same once a tool result follows (TRL's is_chat_template_prefix_preserving)."""
        exchange = self._dummy_exchange("tool_name_sentinel")
        exchange[1]["tool_calls"][0]["function"]["arguments"] = {"argument_sentinel": "value_sentinel"}
        text = self.tokenizer.apply_chat_template(
            [*exchange, {"role": "tool", "name": "tool_name_sentinel", "content": "content_sentinel"}], tokenize=False
        )
        if not all(
            s in text for s in ("tool_name_sentinel", "argument_sentinel", "value_sentinel", "content_sentinel")
        ):
            raise ValueError(
                "tools: the tokenizer's chat template does not render tool calls and tool results; set `template:` "
                "(a lathe template with a tool_format)."
            )
        exchange = self._dummy_exchange("dummy")
        before = self._render(exchange, False)
        after = self._render([*exchange, {"role": "tool", "name": "dummy", "content": "dummy"}], True)
        if after[: len(before)] != before:
            raise ValueError(
                "tools: the chat template renders a conversation's earlier turns differently once a tool result "
                "follows, so tool results cannot be appended to a completion; use `template:` (a lathe template)."
            )

    def suffix_ids(self, tool_messages) -> list[int]:
        """The tokens after the model's tool-call turn (ended by its EOS): the tool results and the next
        generation prompt, as the two renderings of a dummy exchange differ (TRL's method)."""
        exchange = self._dummy_exchange(tool_messages[0]["name"])
        before = self._render(exchange, False)
        full = self._render(exchange + tool_messages, True)
        ends = [i for i, token in enumerate(before) if token == self.tokenizer.eos_token_id]
        if ends:  # the turn's end is the model's EOS; what the template writes after it belongs to the suffix
            before = before[: ends[-1] + 1]
        return full[len(before) :]


class TemplateRendering:
    """lathe's rendering: a Template's slots, its tool_format's description of the tools, tool results as its
    observation turns (several results of one turn joined by a newline into one observation)."""

    def __init__(self, template, tokenizer):
        self.template = template
        self.tokenizer = tokenizer
        self.tool_format = template.tool_format

    def prompt_ids(self, prompt, tools) -> list[int]:
        system = prompt[0]["content"] if prompt and prompt[0]["role"] == "system" else None
        messages = [m for m in prompt if m["role"] != "system"]
        described = json.dumps([schema.get("function", schema) for schema in tool_schemas(tools)]) if tools else None
        ids, _ = self.template.encode_oneturn(
            self.tokenizer, [*messages, {"role": "assistant", "content": ""}], system, described
        )
        return ids

    def suffix_ids(self, tool_messages) -> list[int]:
        results = "\n".join(str(m["content"]) for m in tool_messages)
        messages = [
            {"role": "user", "content": "dummy"},
            {"role": "function", "content": json.dumps({"name": tool_messages[0]["name"], "arguments": {}})},
            {"role": "observation", "content": results},
            {"role": "assistant", "content": ""},
        ]
        (_, call), (observation, _) = self.template.encode_multiturn(self.tokenizer, messages)
        eos = self.tokenizer.eos_token_id
        ends = [i for i, token in enumerate(call) if token == eos]
        tail = call[ends[-1] + 1 :] if ends else []
        return tail + observation


def tool_call_loop(trainer, rendering, prompt_ids, completion_ids, completions, tools_by_row):
    """TRL's loop: while completions call tools (at most max_tool_calling_iterations rounds), run the calls,
    append their results and sample once more from prompt + completion + results. Returns the tool masks (0 on
    the results' tokens), the completions' messages and ids, and the counts of calls and failed calls."""
    args, tokenizer = trainer.args, trainer._tokenizer
    limit = args.max_tool_calling_iterations
    max_length = trainer.model.config.max_position_embeddings
    tool_mask = [[1] * len(ids) for ids in completion_ids]
    pending = [i for i, c in enumerate(completions) if c[0].get("tool_calls")]
    calls = {i: completions[i][0]["tool_calls"] for i in pending}
    call_count = failure_count = rounds = 0
    while pending and (limit is None or rounds < limit):
        extended = {}
        for i in pending:
            results, failures = call_tools(calls[i], tools_by_row[i])
            call_count += len(calls[i])
            failure_count += failures
            messages = [
                {"role": "tool", "name": name, "content": result if isinstance(result, list) else str(result)}
                for name, result in results
            ]
            ids = prompt_ids[i] + completion_ids[i] + rendering.suffix_ids(messages)
            # A tool result that would pass the completion budget or the model's context is dropped: the
            # completion ends as it is.
            if len(ids) - len(prompt_ids[i]) > args.max_completion_length or len(ids) >= max_length:
                continue
            completions[i].extend(messages)
            extended[i] = ids
        pending = list(extended)
        if not pending:
            break
        sampled = generation.sample(
            trainer.model,
            [extended[i] for i in pending],
            trainer.generation_config,
            tokenizer.pad_token_id,
            trainer.eos_token_ids,
            args.device,
            args.gradient_checkpointing_kwargs,
        )
        next_pending = []
        for i, new in zip(pending, sampled):
            so_far = len(extended[i]) - len(prompt_ids[i])
            new = new[: max(0, args.max_completion_length - so_far)]
            tool_mask[i] += [0] * (len(extended[i]) - len(prompt_ids[i]) - len(completion_ids[i])) + [1] * len(new)
            completion_ids[i] = extended[i][len(prompt_ids[i]) :] + new
            if new:
                message = parse_completion(tokenizer, new, rendering.tool_format, list(tools_by_row[i].values()))
                completions[i].append(message)
                if message.get("tool_calls"):
                    calls[i] = message["tool_calls"]
                    next_pending.append(i)
        pending = next_pending
        rounds += 1
    return tool_mask, completions, completion_ids, call_count, failure_count


def resolve_environment_factory(spec, search_dirs=()):
    """A factory, a `module:Class` name, or a dict of them (by environment name)."""
    from lathe.llm.rl.rewards import resolve_reward_function

    if isinstance(spec, dict):
        return {name: resolve_environment_factory(value, search_dirs) for name, value in spec.items()}
    if isinstance(spec, str):
        if ":" not in spec:
            raise ValueError(f"environment_factory: {spec!r} is not 'module:Class' (e.g. 'env:Calculator').")
        return resolve_reward_function(spec, search_dirs)
    return spec


class ToolCalling:
    """What a run with tools holds: the standalone tools, the environments (or None), the rendering."""

    def __init__(self, tools, environments, rendering):
        self.tools = tools
        self.environments = environments
        self.rendering = rendering


def setup_tool_calling(trainer, tools, environment_factory, tool_format=None, template=None, search_dirs=()):
    """The trainer's ToolCalling (None without tools or environments); an environment owning its reward
    (get_reward) is added as a reward function, weight 1, named after its class, as TRL does."""
    import torch

    from lathe.llm.rl.environments import Environments

    tools = resolve_tools(tools, search_dirs)
    if not tools and environment_factory is None:
        return None
    environments = None
    if environment_factory is not None:
        environments = Environments(resolve_environment_factory(environment_factory, search_dirs), tools)
        for function in environments.reward_functions:
            trainer.reward_funcs.append(function)
            trainer.reward_func_names.append(function.__name__)
            trainer.reward_processing_classes.append(None)
            trainer.reward_weights = torch.cat([trainer.reward_weights, torch.ones(1)])
        tools = environments.all_tools()
    if not trainer.reward_funcs:
        raise ValueError(
            "No reward source: give reward_funcs, or an environment_factory whose environment has get_reward()."
        )
    if tools:
        tool_schemas(tools)  # each tool describable, checked now rather than at the first batch
    if template is not None:
        rendering = TemplateRendering(template, trainer._tokenizer)
    else:
        rendering = ChatTemplateRendering(trainer._tokenizer, trainer.args.chat_template_kwargs, tool_format)
    return ToolCalling(tools, environments, rendering)


def rollouts_with_tools(trainer, inputs, prompts, row_ids):
    """Prompts (with the environments' observations), prompt and completion ids, tool masks (None without
    tools), the completions as messages, and the extra reward arguments (`environments`)."""
    calling, args, tokenizer = trainer.tool_calling, trainer.args, trainer._tokenizer
    if not generation.is_conversation(prompts[0]):
        raise ValueError(
            f"tools / environment_factory need conversational prompts (dataset row {row_ids[0]}'s prompt is text)."
        )
    extras = {}
    if calling.environments is not None:
        environments = calling.environments
        names = environments.names_of(inputs, row_ids)
        instances = environments.instances_for(names)
        offered = [environments.tools_by_environment[name] for name in names]
        callable_by_row = [environments.tools_by_name(instance) for instance in instances]
        prompts = environments.reset(instances, prompts, inputs)
        extras["environments"] = instances
    else:
        offered = [calling.tools] * len(prompts)
        callable_by_row = [{tool.__name__: tool for tool in calling.tools}] * len(prompts)
    prompt_ids = [calling.rendering.prompt_ids(p, tools) for p, tools in zip(prompts, offered)]
    if args.max_prompt_length is not None:
        prompt_ids = [ids[-args.max_prompt_length :] for ids in prompt_ids]
    completion_ids = generation.sample(
        trainer.model,
        prompt_ids,
        trainer.generation_config,
        tokenizer.pad_token_id,
        trainer.eos_token_ids,
        args.device,
        args.gradient_checkpointing_kwargs,
    )
    if not calling.tools:  # environments without tool methods: plain answers
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        return prompts, prompt_ids, completion_ids, None, [[{"role": "assistant", "content": t}] for t in texts], extras
    completions = [
        [parse_completion(tokenizer, ids, calling.rendering.tool_format, tools)]
        for ids, tools in zip(completion_ids, offered)
    ]
    tool_mask, completions, completion_ids, calls, failures = tool_call_loop(
        trainer, calling.rendering, prompt_ids, completion_ids, completions, callable_by_row
    )
    _log_tool_metrics(trainer, calls, failures, len(prompts))
    return prompts, prompt_ids, completion_ids, tool_mask, completions, extras


def _log_tool_metrics(trainer, calls: int, failures: int, rollouts: int) -> None:
    """TRL's tools/call_frequency (calls per completion) and tools/failure_frequency (failed per call), over
    every process's completions."""
    import torch

    from lathe.llm.rl import ranks

    counts = ranks.gather(torch.tensor([[calls, failures, rollouts]], dtype=torch.float64)).sum(dim=0)
    metrics = trainer._metrics["train" if trainer.model.training else "eval"]
    metrics["tools/call_frequency"].append((counts[0] / counts[2]).item())
    metrics["tools/failure_frequency"].append((counts[1] / counts[0]).item() if counts[0] > 0 else 0.0)
