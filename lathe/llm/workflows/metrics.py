"""BLEU-4 and ROUGE-1/2/L of generated answers against the references, as LLaMA-Factory 0.9.5 reports them
with predict_with_generate (`predict_bleu-4`, `predict_rouge-1`, ...), plus lathe's exact match.

Its recipe, kept exactly so the numbers agree: decode predictions and labels with the special tokens
skipped (-100 read as padding), no stripping; ROUGE F-scores (rouge-chinese) over jieba's word split, 0
when either side has no word; sentence BLEU-4 (nltk, smoothing method 3) over characters; each x100,
rounded to 4 decimals per example, then averaged. jieba, nltk and rouge-chinese are optional
(`lathe[metrics]`), imported here only: without them the run reports the exact match and says what to
install.
"""

from __future__ import annotations

import logging

import numpy as np

from lathe.llm.workflows.outputs import ExactMatch
from lathe.train.data.labels import IGNORE_INDEX

__all__ = ["GenerationMetrics", "similarity_scores"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'lathe[metrics]'  (or: pip install jieba nltk rouge-chinese)"


def _scorers():
    """(jieba, sentence_bleu, SmoothingFunction, Rouge), or None when a package is missing."""
    try:
        import jieba
        from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu
        from rouge_chinese import Rouge
    except ImportError:
        return None
    jieba.setLogLevel(logging.WARNING)  # jieba logs its dictionary loading at INFO on first use
    return jieba, sentence_bleu, SmoothingFunction, Rouge


def similarity_scores(prediction: str, reference: str, scorers) -> dict[str, float]:
    """One example's rouge-1, rouge-2, rouge-l (F x100) and bleu-4 (x100), each rounded to 4 decimals."""
    jieba, sentence_bleu, smoothing, rouge = scorers
    hypothesis, words = list(jieba.cut(prediction)), list(jieba.cut(reference))
    if not " ".join(hypothesis).split() or not " ".join(words).split():
        scores = {"rouge-1": 0.0, "rouge-2": 0.0, "rouge-l": 0.0}
    else:
        result = rouge().get_scores(" ".join(hypothesis), " ".join(words))[0]
        scores = {name: round(value["f"] * 100, 4) for name, value in result.items()}
    bleu = sentence_bleu([list(reference)], list(prediction), smoothing_function=smoothing().method3)
    scores["bleu-4"] = round(bleu * 100, 4)
    return scores


class GenerationMetrics:
    """compute_metrics for predict_with_generate: LLaMA-Factory's similarity scores and the exact match."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.exact_match = ExactMatch(tokenizer, skip_special_tokens)
        self.scorers = _scorers()
        if self.scorers is None:
            logger.warning(
                "BLEU-4 and ROUGE (as LLaMA-Factory reports them) need jieba, nltk and rouge-chinese: %s. "
                "Reporting the exact match only.",
                INSTALL_HINT,
            )

    def _decode(self, rows) -> list[str]:
        rows = np.where(np.asarray(rows) != IGNORE_INDEX, rows, self.tokenizer.pad_token_id)
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def __call__(self, eval_prediction) -> dict[str, float]:
        metrics = {}
        if self.scorers is not None:
            pairs = zip(self._decode(eval_prediction.predictions), self._decode(eval_prediction.label_ids))
            per_example = [similarity_scores(prediction, reference, self.scorers) for prediction, reference in pairs]
            for name in ("rouge-1", "rouge-2", "rouge-l", "bleu-4"):
                metrics[name] = float(np.mean([scores[name] for scores in per_example]))
        metrics.update(self.exact_match(eval_prediction))
        return metrics
