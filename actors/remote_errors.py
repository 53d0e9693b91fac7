"""A remote task's error in one line: what ``ray.get`` raised, unwrapped to the task's own exception.

``RayTaskError``'s text is the whole remote traceback (~60 lines); the user needs the cause and the
actor method that raised it. What ``ray.get`` raises is a ``RayTaskError(<cause type>)`` that keeps
``cause`` (public API) but not ``function_name``; its text still names the task (``ray::X.y()``).
"""

import re

import ray

_TASK = re.compile(r"ray::([\w.]+)\(")
_RAISED = re.compile(r"^(?:[\w]+\.)*\w*(?:Error|Exception)\b.*$", re.M)
"""A traceback's exception line (``pkg.mod.SomeError: message``, or a bare ``SomeError``)."""


def last_raised(text: str) -> str:
    """An error text holding a traceback (an actor that died in its creation task: Ray passes on only the
    traceback's text when the exception cannot be pickled, e.g. vLLM's pydantic errors) said as its first
    line and the last exception raised, with whatever follows it (a pydantic error's details); other
    texts unchanged. The cause sat after 129 lines of traceback, past the console's cut (probe 10)."""
    if "Traceback (most recent call last)" not in text:
        return text
    found = list(_RAISED.finditer(text))
    if not found:
        return text
    first = text.strip().splitlines()[0].rstrip(":")
    return f"{first}: {text[found[-1].start():]}"


_EXIT = re.compile(r"Worker exit type: (\w+)(?: Worker exit detail: (.*?\.)(?:\s|$))?")
_PID = re.compile(r"\bpid: (\d+)")
_IP = re.compile(r"\bip: (\S+)")
_UNEXPECTED = {"SYSTEM_ERROR", "NODE_OUT_OF_MEMORY", "UNEXPECTED_SYSTEM_EXIT"}
"""Exit types Ray gives a process that did not end on its own or by an error of its code."""


def process_death(text: str) -> str | None:
    """Ray's text on an actor whose process died (``ActorDiedError``: the actor's ids, namespace and
    a paragraph of possible causes, ~420 characters on the console, a probe) said short: ``its
    process (pid P on IP) died: EXIT_TYPE, <the exit detail's first sentence>``, with the likely
    causes for an unexpected exit; None for any other text (an actor killed by ``ray.kill``, an
    error in its constructor)."""
    found = _EXIT.search(text)
    if found is None:
        return None
    pid, ip = _PID.search(text), _IP.search(text)
    where = " on ".join(x for x in (pid and f"pid {pid.group(1)}", ip and ip.group(1)) if x)
    detail = f", {found.group(2).rstrip('.')}" if found.group(2) else ""
    unexpected = " (killed, out of memory, or a crash)" if found.group(1) in _UNEXPECTED else ""
    return f"its process{f' ({where})' if where else ''} died: {found.group(1)}{detail}{unexpected}"


def remote_error(exc: BaseException, limit: int = 400, with_type: bool = False) -> str:
    """``"<Type>: <message> (in <Actor.method>)"`` of the innermost cause of ``exc`` (``exc`` itself
    when it is not a remote task's error: its message only, unless ``with_type``, for a message that wraps
    it in an error of its own), white space collapsed, at most ``limit`` characters."""
    where, cause = None, exc
    while isinstance(cause, ray.exceptions.RayTaskError) and cause.cause is not None:
        # a task's error raised on in the task that called it (rank 0 calling the correction service)
        # arrives as ONE RayTaskError whose text lists every task, outermost first: the last raised it
        named = _TASK.findall(str(cause))
        where = getattr(cause, "function_name", None) or (named[-1] if named else None) or where
        cause = cause.cause
    text = " ".join(last_raised(str(cause)).split())
    if len(text) > limit:
        text = text[:limit] + " ..."
    return (f"{type(cause).__name__}: {text}" if cause is not exc or with_type else text) + (f" (in {where})" if where else "")
