"""The reward of examples/grpo/digits.yaml (`reward_funcs: rewards:digit_match`, imported from this folder):
verifiable, no reward model. TRL's convention: the completions (conversational: one assistant message each)
and every other column of the dataset row, here `digit`, one value per completion."""


def digit_match(completions, digit, **kwargs):
    """The share of the answer's words that are the asked digit (0 for an empty answer)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(word == str(d) for word in text.split()) / max(1, len(text.split())) for text, d in zip(texts, digit)]
