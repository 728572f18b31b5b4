"""Located diagnostics for configuration input.

A diagnostic names the setting by its key path (``group.proxy.policy``,
``routing.rules[2]``) and, where the source gives one, the file and line. It
never carries a configuration value: values may be secrets (passwords in share
links, API secrets), so messages describe the problem, not the text.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from honk.core.errors import HonkError


class Severity(enum.Enum):
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """Where a piece of configuration came from; ``line`` is 1-based, 0 if unknown."""

    file: str = ""
    line: int = 0

    def __str__(self) -> str:
        if self.file and self.line:
            return f"{self.file}:{self.line}"
        if self.line:
            return f"line {self.line}"
        return self.file or "<input>"


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """One finding about a configuration.

    ``code`` is a stable kebab-case slug (``unterminated-quote``,
    ``unknown-traffic-predicate``), following the upstream dialect reference
    where it names one.
    """

    severity: Severity
    code: str
    key_path: str
    message: str
    loc: SourceLoc = field(default_factory=SourceLoc)

    def __str__(self) -> str:
        return f"{self.loc}: {self.severity.value}: {self.key_path}: {self.message} [{self.code}]"


class ConfigError(HonkError):
    """A configuration was rejected; ``diagnostics`` holds every finding, errors first."""

    def __init__(self, diagnostics: list[Diagnostic] | tuple[Diagnostic, ...]) -> None:
        ordered = sorted(diagnostics, key=lambda d: d.severity is not Severity.ERROR)
        self.diagnostics: tuple[Diagnostic, ...] = tuple(ordered)
        errors = [d for d in self.diagnostics if d.severity is Severity.ERROR]
        head = str(errors[0]) if errors else "invalid configuration"
        more = f" (+{len(errors) - 1} more errors)" if len(errors) > 1 else ""
        super().__init__(head + more)

    @property
    def errors(self) -> tuple[Diagnostic, ...]:
        return tuple(d for d in self.diagnostics if d.severity is Severity.ERROR)
