"""Helpers shared by the config loader tests (imported as a plain module)."""

from __future__ import annotations

from dataclasses import dataclass

from honk.config.diagnostics import ConfigError, Diagnostic
from honk.config.load import load_text
from honk.config.spec import Spec

SECRET = "s3cretPW"


@dataclass
class Outcome:
    spec: Spec | None
    error: ConfigError | None
    diagnostics: tuple[Diagnostic, ...]

    def find(self, code: str) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.code == code]

    def assert_no_secret(self) -> None:
        for d in self.diagnostics:
            assert SECRET not in str(d)
            assert SECRET not in repr(d)
        if self.error is not None:
            assert SECRET not in str(self.error)
        if self.spec is not None:
            assert SECRET not in repr(self.spec)


def run(text: str, fmt: str = "dae", **kwargs: object) -> Outcome:
    try:
        spec = load_text(text, fmt, **kwargs)  # type: ignore[arg-type]
    except ConfigError as exc:
        return Outcome(None, exc, exc.diagnostics)
    return Outcome(spec, None, spec.diagnostics)
