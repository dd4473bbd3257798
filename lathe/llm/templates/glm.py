"""GLM: <|user|> / <|assistant|> turns after a [gMASK]<sop> prefix, no EOS in answers (efficient_eos: the
EOS is trained where the next prompt starts) and <|user|> / <|observation|> as stop words. chatglm3, glm4,
glm_ocr, the reasoning glm4_moe, glm4v, glm4_5v, glmz1, glm4_7 and aeva (whose empty thought is only
</think>)."""

from lathe.llm.templates.template import SpecialToken, Template

_GLM = dict(
    user=("<|user|>\n{{content}}<|assistant|>",),
    assistant=("\n{{content}}",),
    system=("<|system|>\n{{content}}",),
    function=("{{content}}",),
    observation=("<|observation|>\n{{content}}<|assistant|>",),
    prefix=("[gMASK]<sop>",),
    tool_format="glm4",
    stop_words=("<|user|>", "<|observation|>"),
    efficient_eos=True,
)
_ANSWER_STOP = ("<|user|>", "<|observation|>", "</answer>")
_GLM47 = dict(
    _GLM, tool_format="glm4_moe", thought_words=("<think>", "</think>"), reasoning=True, empty_thought="</think>"
)


def _token(text: str) -> SpecialToken:
    return SpecialToken("token", text)


TEMPLATES = [
    # ChatGLM3 writes its role markers by id (they are not in the text vocabulary)
    Template(
        name="chatglm3",
        **dict(
            _GLM,
            user=(_token("<|user|>"), "\n", "{{content}}", _token("<|assistant|>")),
            assistant=("\n", "{{content}}"),
            system=(_token("<|system|>"), "\n", "{{content}}"),
            observation=(_token("<|observation|>"), "\n", "{{content}}", _token("<|assistant|>")),
            prefix=(_token("[gMASK]"), _token("sop")),
        ),
    ),
    Template(name="glm4", **_GLM),
    Template(name="glm_ocr", multimodal="glm4v", **_GLM),
    Template(name="glmz1", reasoning=True, **_GLM),
    Template(name="glm4_moe", reasoning=True, **{**_GLM, "tool_format": "glm4_moe"}),
    Template(name="glm4v", reasoning=True, multimodal="glm4v", **{**_GLM, "stop_words": _ANSWER_STOP}),
    Template(
        name="glm4_5v",
        reasoning=True,
        multimodal="glm4v",
        **{**_GLM, "tool_format": "glm4_moe", "stop_words": _ANSWER_STOP},
    ),
    Template(name="glm4_7", **_GLM47),
    Template(
        name="aeva",
        default_system=(
            "You are an AI assistant named Aeva created by Zongzhi Lou. "
            "Your answer should be friendly, unbiased, faithful, informative and detailed."
        ),
        **_GLM47,
    ),
]
