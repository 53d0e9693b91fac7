"""This machine's CPU as Linux describes it: the fields of ``/proc/cpuinfo``'s first processor."""

from pathlib import Path


def cpuinfo_fields(cpuinfo: str | None = None) -> dict[str, str]:
    """``{key: value}`` of the first processor's ``key : value`` lines in ``cpuinfo`` (``/proc/cpuinfo``'s
    text, read when None; ``{}`` where it cannot be read), e.g. ``"model name"``, ``"flags"`` (x86) or
    ``"Features"`` (Arm); a key that repeats keeps its first value."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return {}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields
