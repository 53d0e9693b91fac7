"""A model's config and tokenizer as transformers loads them, once per process.

The driver reads both at start twice over: ``model_dir.check_loadable`` (a pretrained model's checks)
and ``data.context_fit.token_counter`` (prompts against the context); a large tokenizer takes about a
second to load. Cached by path, with the directory's modification time in the key, so a directory
written again (a model saved anew at the same path) is read again.
"""

import functools
import os


def _stamp(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:  # a hub id
        return None


def load_config(path: str, trust_remote_code: bool = False):
    """``AutoConfig.from_pretrained(path)``, cached."""
    return _config(path, trust_remote_code, _stamp(path))


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """``AutoTokenizer.from_pretrained(path)``, cached (the object is shared: read it, do not change it)."""
    return _tokenizer(path, trust_remote_code, _stamp(path))


@functools.lru_cache(maxsize=8)
def _config(path: str, trust_remote_code: bool, _stamp: int | None):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)


@functools.lru_cache(maxsize=8)
def _tokenizer(path: str, trust_remote_code: bool, _stamp: int | None):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
