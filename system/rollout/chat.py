"""Prompts for chat (Instruct) models: the task's text as one user turn in the model's chat template.

``data.task.chat_template`` (GSM8K-style tasks): each prompt becomes the token ids of
``[{"role": "user", "content": text}]`` rendered by the tokenizer's own template with the
assistant turn opened (``add_generation_prompt``), as verl and TRL prompt Instruct models. The
ids go to vLLM as they are (no second BOS from re-tokenising a rendered string), and the learner
scores exactly the ids vLLM reports back (``system.learner.batch``), so the template adds no
train-inference mismatch.
"""

from collections.abc import Sequence


def check_chat_template(tokenizer) -> None:
    """Raise ``ValueError`` when the tokenizer has no chat template to render prompts with."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("data.task.chat_template=true, but the model's tokenizer has no chat template "
                         "(a base model: set data.task.chat_template=false and write the prompt in "
                         "data.task.prompt_template)")


def chat_prompt_ids(tokenizer, text: str) -> list[int]:
    """The token ids of ``text`` as one user turn, the assistant's turn opened."""
    check_chat_template(tokenizer)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                             add_generation_prompt=True, return_dict=True)
    return [int(i) for i in rendered["input_ids"]]


def as_engine_prompts(prompts: Sequence[str | Sequence[int]]) -> list:
    """vLLM's prompt inputs: a string as is, token ids as ``{"prompt_token_ids": [...]}``."""
    return [p if isinstance(p, str) else {"prompt_token_ids": [int(i) for i in p]} for p in prompts]
