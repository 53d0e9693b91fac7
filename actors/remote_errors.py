"""A remote task's error in one line: what ``ray.get`` raised, unwrapped to the task's own exception.

``RayTaskError``'s text is the whole remote traceback (~60 lines); the user needs the cause and the
actor method that raised it. What ``ray.get`` raises is a ``RayTaskError(<cause type>)`` that keeps
``cause`` (public API) but not ``function_name``; its text still names the task (``ray::X.y()``).
"""

import re

import ray

_TASK = re.compile(r"ray::([\w.]+)\(")


def remote_error(exc: BaseException, limit: int = 400) -> str:
    """``"<Type>: <message> (in <Actor.method>)"`` of the innermost cause of ``exc`` (``exc`` itself
    when it is not a remote task's error), white space collapsed, at most ``limit`` characters."""
    where, cause = None, exc
    while isinstance(cause, ray.exceptions.RayTaskError) and cause.cause is not None:
        # a task's error raised on in the task that called it (rank 0 calling the correction service)
        # arrives as ONE RayTaskError whose text lists every task, outermost first: the last raised it
        named = _TASK.findall(str(cause))
        where = getattr(cause, "function_name", None) or (named[-1] if named else None) or where
        cause = cause.cause
    text = " ".join(str(cause).split())
    if len(text) > limit:
        text = text[:limit] + " ..."
    return (f"{type(cause).__name__}: {text}" if cause is not exc else text) + (f" (in {where})" if where else "")
