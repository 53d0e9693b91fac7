"""Facts about the deploy files read straight from the repository, apart from the validator
(``kuberay_checks``), for the manifest tests to check the validator's verdicts against."""

import re

from kuberay_checks import ROOT  # a helper package beside the tests

JOB_NAME = "aisrl-qwen25-gsm8k"
"""The RayJob's name in ``deploy/kuberay/rayjob.yaml``."""


def image_user() -> tuple[int, int]:
    """``(uid, gid)`` of the user deploy/Dockerfile creates."""
    text = (ROOT / "deploy" / "Dockerfile").read_text()
    [uid] = re.findall(r"useradd [^\n]*--uid (\d+)", text)
    [gid] = re.findall(r"groupadd [^\n]*--gid (\d+)", text)
    return int(uid), int(gid)
