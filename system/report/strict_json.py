"""Strict JSON for the report files: no ``NaN`` / ``Infinity`` tokens (they are not JSON).

Every undefined or non-finite number becomes ``null``; numpy scalars and arrays become plain
python values; the encoder runs with ``allow_nan=False`` so anything that slipped through is
an error here rather than a file a strict parser rejects.
"""

import json
import math
from pathlib import Path

import numpy as np


def jsonable(value):
    """``value`` with non-finite floats as None, numpy values as python values, tuples as lists."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if math.isfinite(value) else None
    if callable(getattr(value, "tolist", None)):  # a torch tensor (0-d too), a numpy scalar of another kind
        return jsonable(value.tolist())
    return value


def dumps(value, *, sanitize: bool = True, **kwargs) -> str:
    """Strict JSON text of ``value``; ``sanitize=False`` skips the walk for values known to be clean
    (the encoder still refuses a non-finite float)."""
    return json.dumps(jsonable(value) if sanitize else value, allow_nan=False, **kwargs)


def write(path: str | Path, value, *, sanitize: bool = True, **kwargs) -> Path:
    """Write ``dumps(value)`` to ``path`` (UTF-8)."""
    out = Path(path)
    out.write_text(dumps(value, sanitize=sanitize, **kwargs), encoding="utf-8", errors="replace")
    return out
