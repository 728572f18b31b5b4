"""Why an apply was refused: the reconciler's typed errors and their texts.

Each error's ``str()`` is the exact text the API returns, ``honkctl`` prints and the
reload log line carries. ``variant`` is the stable label of the kind of refusal
(metrics: ``honk_reloads_total{error=...}``). Plan-time errors (validation) and
prepare-time errors (build, bind) both leave the running daemon untouched.
"""

from __future__ import annotations

import os

STOPPED_TEXT = "the reconciler has shut down"


class ApplyError(Exception):
    """An apply, update or user edit that changed nothing."""

    variant = "invalid"
    status = 400  # the API's answer for it


class FileRefused(ApplyError):
    """The configuration file did not load: its first located error (all are logged)."""

    variant = "config"

    def __init__(self, text: str, error: BaseException | None = None) -> None:
        super().__init__(text)
        self.error = error


class DuplicateTag(ApplyError):
    variant = "duplicate_tag"

    def __init__(self, kind: str, tag: str) -> None:
        super().__init__(f"duplicate {kind} tag {tag}")
        self.kind, self.tag = kind, tag


class UnknownReference(ApplyError):
    variant = "unknown_reference"

    def __init__(self, source: str, kind: str, tag: str) -> None:
        super().__init__(f"{source} references unknown {kind} {tag}")
        self.source, self.kind, self.tag = source, kind, tag


class EmptyGroup(ApplyError):
    variant = "empty_group"

    def __init__(self, group: str) -> None:
        super().__init__(f"group {group} has no members")
        self.group = group


class Invalid(ApplyError):
    variant = "invalid"

    def __init__(self, resource: str, reason: str) -> None:
        super().__init__(f"{resource}: {reason}")
        self.resource, self.reason = resource, reason


class Disruptive(ApplyError):
    """A change that ends an inbound's live connections, without ``allow_disruptive``."""

    variant = "disruptive"
    status = 409

    def __init__(self, inbound: str, reason: str) -> None:
        super().__init__(
            f"inbound {inbound}: {reason}; this ends its live connections and needs allow_disruptive"
        )
        self.inbound, self.reason = inbound, reason


class BuildFailed(ApplyError):
    variant = "build"

    def __init__(self, resource: str, source: BaseException | str) -> None:
        super().__init__(f"building {resource} failed: {_text(source)}")
        self.resource, self.source = resource, source


class BindFailed(ApplyError):
    variant = "bind"

    def __init__(self, inbound: str, bind: str, source: BaseException | str) -> None:
        super().__init__(f"inbound {inbound}: binding {bind} failed: {_text(source)}")
        self.inbound, self.bind, self.source = inbound, bind, source


class Stopped(ApplyError):
    variant = "stopped"
    status = 503

    def __init__(self) -> None:
        super().__init__(STOPPED_TEXT)


def refusal_kinds() -> dict[str, int]:
    """Each refusal's variant and the API status it answers with."""
    kinds: dict[str, int] = {}
    for kind in (
        FileRefused,
        DuplicateTag,
        UnknownReference,
        EmptyGroup,
        Invalid,
        Disruptive,
        BuildFailed,
        BindFailed,
        Stopped,
    ):
        kinds[kind.variant] = kind.status
    return kinds


def _text(source: BaseException | str) -> str:
    if isinstance(source, OSError) and source.errno:
        return os.strerror(source.errno)  # the system's words, not a wrapper's restatement
    if isinstance(source, OSError) and source.strerror:
        return source.strerror
    return str(source) or type(source).__name__
