"""A local stand-in for the `evaluate` package, for transformers' example scripts run offline by bench/example_scripts.py.

`evaluate.load(name)` fetches the metric's code from the hub; offline it cannot. bench/example_shim.py puts this
folder first on sys.path for BOTH Trainers, so whatever it computes is the same on both sides. The metrics
follow the outputs of evaluate's hub modules (same keys) and use the same libraries where those are installed:
scikit-learn/scipy (accuracy, f1, matthews, pearson, spearman, mse; numpy fall-backs), `seqeval`,
`rouge_score`, `sacrebleu`; squad's exact match and F1 follow its official script. One deliberate change: rouge is the plain mean of the F-measures, not evaluate's
bootstrap "mid" value (that resamples with numpy's unseeded global RNG, so it is not reproducible run to run).
"""

import numpy as np

__version__ = "0.0-lathe-bench-stand-in"


def _accuracy(predictions, references, **_):
    return {"accuracy": float(np.mean(np.asarray(predictions) == np.asarray(references)))}


def _f1(predictions, references, **_):
    from sklearn.metrics import f1_score

    return {"f1": float(f1_score(references, predictions))}


def _matthews(predictions, references, **_):
    from sklearn.metrics import matthews_corrcoef

    return {"matthews_correlation": float(matthews_corrcoef(references, predictions))}


def _mse(predictions, references, **_):
    diff = np.asarray(predictions, dtype=np.float64) - np.asarray(references, dtype=np.float64)
    return {"mse": float(np.mean(diff * diff))}


def _glue(config_name):
    def compute(predictions, references, **_):
        if config_name == "stsb":
            from scipy.stats import pearsonr, spearmanr

            return {
                "pearson": float(pearsonr(predictions, references)[0]),
                "spearmanr": float(spearmanr(predictions, references)[0]),
            }
        if config_name == "cola":
            return _matthews(predictions, references)
        result = _accuracy(predictions, references)
        if config_name in ("mrpc", "qqp"):
            result.update(_f1(predictions, references))
        return result

    return compute


def _seqeval(predictions, references, suffix=False, scheme=None, mode=None, sample_weight=None, zero_division="warn"):
    from seqeval.metrics import accuracy_score, classification_report

    if scheme is not None:
        import importlib

        scheme = getattr(importlib.import_module("seqeval.scheme"), scheme)
    report = classification_report(
        y_true=references,
        y_pred=predictions,
        suffix=suffix,
        output_dict=True,
        scheme=scheme,
        mode=mode,
        sample_weight=sample_weight,
        zero_division=zero_division,
    )
    report.pop("macro avg")
    report.pop("weighted avg")
    overall = report.pop("micro avg")
    scores = {
        kind: {"precision": s["precision"], "recall": s["recall"], "f1": s["f1-score"], "number": s["support"]}
        for kind, s in report.items()
    }
    scores["overall_precision"] = overall["precision"]
    scores["overall_recall"] = overall["recall"]
    scores["overall_f1"] = overall["f1-score"]
    scores["overall_accuracy"] = accuracy_score(y_true=references, y_pred=predictions)
    return scores


def _rouge(predictions, references, rouge_types=None, use_aggregator=True, use_stemmer=False, tokenizer=None):
    from rouge_score import rouge_scorer

    rouge_types = rouge_types or ["rouge1", "rouge2", "rougeL", "rougeLsum"]
    scorer = rouge_scorer.RougeScorer(rouge_types=rouge_types, use_stemmer=use_stemmer, tokenizer=tokenizer)
    scores = [scorer.score(ref, pred) for ref, pred in zip(references, predictions)]
    if use_aggregator:
        return {key: float(np.mean([s[key].fmeasure for s in scores])) for key in rouge_types}
    return {key: [s[key].fmeasure for s in scores] for key in rouge_types}


def _sacrebleu(predictions, references, smooth_method="exp", smooth_value=None, lowercase=False, **kwargs):
    import sacrebleu

    per_prediction = len(references[0])
    transposed = [[refs[i] for refs in references] for i in range(per_prediction)]
    output = sacrebleu.corpus_bleu(
        predictions, transposed, smooth_method=smooth_method, smooth_value=smooth_value, lowercase=lowercase
    )
    return {
        "score": output.score,
        "counts": output.counts,
        "totals": output.totals,
        "precisions": output.precisions,
        "bp": output.bp,
        "sys_len": output.sys_len,
        "ref_len": output.ref_len,
    }


def _squad_normalize(text):
    """SQuAD's answer normalization: lower case, no punctuation, no articles, single spaces."""
    import re
    import string

    text = "".join(ch for ch in text.lower() if ch not in set(string.punctuation))
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def _squad_f1(prediction, truth):
    from collections import Counter

    predicted, expected = _squad_normalize(prediction).split(), _squad_normalize(truth).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def _squad(predictions, references, **_):
    """evaluate's "squad": exact_match and f1 in percent, each the best over an example's reference answers."""
    truths = {ref["id"]: ref["answers"]["text"] for ref in references}
    exact = f1 = 0.0
    for prediction in predictions:
        answers = truths[prediction["id"]]
        text = prediction["prediction_text"]
        exact += max(float(_squad_normalize(text) == _squad_normalize(a)) for a in answers)
        f1 += max(_squad_f1(text, a) for a in answers)
    return {"exact_match": 100.0 * exact / len(predictions), "f1": 100.0 * f1 / len(predictions)}


_METRICS = {
    "accuracy": _accuracy,
    "f1": _f1,
    "matthews_correlation": _matthews,
    "mse": _mse,
    "seqeval": _seqeval,
    "rouge": _rouge,
    "sacrebleu": _sacrebleu,
    "squad": _squad,
}


class Metric:
    """What `evaluate.load` returns: `compute(predictions=..., references=..., **options)`."""

    def __init__(self, name, config_name=None):
        self.name = name
        self._compute = _glue(config_name) if name == "glue" else _METRICS[name]
        self._predictions, self._references = [], []

    def add_batch(self, predictions=None, references=None):
        self._predictions.extend(predictions)
        self._references.extend(references)

    def compute(self, predictions=None, references=None, **kwargs):
        if predictions is None:
            predictions, references = self._predictions, self._references
            self._predictions, self._references = [], []
        return self._compute(predictions=predictions, references=references, **kwargs)


def load(path, config_name=None, **_kwargs):
    name = path.rstrip("/").split("/")[-1]
    if name != "glue" and name not in _METRICS:
        raise ValueError(f"bench's evaluate stand-in has no metric {path!r}; it has glue, {', '.join(_METRICS)}")
    return Metric(name, config_name)
