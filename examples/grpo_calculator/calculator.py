"""The calculator tool and the reward of examples/grpo_calculator/calculator.yaml.

`add` is offered to the model as a tool (its JSON schema comes from the signature and the docstring); the
reward reads each completion's messages (the model's tool call, the tool's result, the model's answer)."""


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a + b


def right_call(completions, a, b, **kwargs):
    """A quarter point per argument of the first `add` call that is one of the question's two numbers, and half
    a point when the final answer is their sum."""
    rewards = []
    for messages, x, y in zip(completions, a, b):
        calls = [call["function"] for m in messages for call in m.get("tool_calls") or []]
        score = 0.0
        if calls and calls[0]["name"] == "add":
            arguments = calls[0]["arguments"]
            score += 0.25 * (arguments.get("a") in (x, y)) + 0.25 * (arguments.get("b") in (x, y))
        answer = messages[-1]["content"].strip() if messages[-1]["role"] == "assistant" else ""
        score += 0.5 * (answer == str(x + y))
        rewards.append(score)
    return rewards
