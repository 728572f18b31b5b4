"""What one apply did: the :class:`ApplyReport` and its summary line."""

from __future__ import annotations

from dataclasses import dataclass, field

# The order the summary lists fields in ("config reloaded: built [...]; ...; reused [...]").
SUMMARY_ORDER = ("built", "swapped", "drained", "rebound", "restarted", "removed", "reused")
NOTHING_TO_RUN = "nothing to run"


@dataclass(slots=True)
class ApplyReport:
    """Resources by what happened to them, each in plan order.

    ``built``/``reused`` hold resource texts (``outbound direct@v2``, ``group lb``,
    ``route``), ``drained`` outbound versions (``direct@v1``), the others inbound tags."""

    reused: list[str] = field(default_factory=list)
    built: list[str] = field(default_factory=list)
    swapped: list[str] = field(default_factory=list)
    drained: list[str] = field(default_factory=list)
    rebound: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    epoch: int = 0  # the plane epoch after the apply

    def summary(self) -> str:
        parts = [f"{name} [{', '.join(items)}]" for name in SUMMARY_ORDER if (items := getattr(self, name))]
        return "; ".join(parts) if parts else NOTHING_TO_RUN

    def to_json(self) -> dict[str, object]:
        body: dict[str, object] = {name: list(getattr(self, name)) for name in SUMMARY_ORDER}
        body["epoch"] = self.epoch
        body["summary"] = self.summary()
        return body
