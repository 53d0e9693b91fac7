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


def token_names(path: str, trust_remote_code: bool = False):
    """``id -> token string``, as the tokenizer's ``convert_ids_to_tokens`` gives it for one id (None
    outside its vocabulary). A local directory with a ``tokenizer.json`` is read with the ``tokenizers``
    library alone (~0.1 s to import, where transformers' ``AutoTokenizer`` takes ~3 s of a fast 2-core
    machine and 10 s of a slow one: the correction service decodes dumped tokens with this while the
    first steps run); any other tokenizer through transformers."""
    file = os.path.join(path, "tokenizer.json")
    if os.path.isfile(file):
        from tokenizers import Tokenizer

        return Tokenizer.from_file(file).id_to_token
    return load_tokenizer(path, trust_remote_code).convert_ids_to_tokens
