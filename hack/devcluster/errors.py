"""Errors of the dev-cluster launcher.

Every error names the step that failed; a start failure also carries the
command line and the last lines of that component's log, so the reader sees
why a binary exited without opening files.
"""

from __future__ import annotations

from collections.abc import Sequence


class ClusterError(Exception):
    """A step of bringing the control plane up or down failed."""

    def __init__(self, step: str, message: str) -> None:
        super().__init__(f"dev-cluster: step {step!r}: {message}")
        self.step = step


class StartError(ClusterError):
    """A component did not start or did not become ready."""

    def __init__(self, step: str, reason: str, command: Sequence[str], log_tail: str) -> None:
        text = f"{reason}\n  command: {' '.join(command)}"
        if log_tail:
            text += "\n  last lines of its log:\n" + "\n".join(
                "    " + line for line in log_tail.splitlines()
            )
        super().__init__(step, text)
        self.reason = reason
        self.command = tuple(command)
        self.log_tail = log_tail
