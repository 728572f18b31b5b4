"""One log line per flow, when it is established: every path writes it through :func:`log_flow_opened`.

The record carries two renderings of one event. Its message is honk's own
``flow opened network=tcp inbound=… source=… target=… rule=… chain=…`` (stderr,
journald, the native ``/v1/logs``); its :data:`~honk.core.logs.FLOW_FIELD` attribute
holds the facts as a :class:`FlowOpened`, which the Clash ``/logs`` stream renders in
mihomo's shape (``[TCP] src --> target match Type(payload) using Group[leaf]``, see
:func:`honk.api.clash_views.flow_log_text`) only when a dashboard reads it.

What a line shows: addresses, the rule's text and outbound names. Never a node's link or
credentials, never Score's target data (:class:`~honk.connection.dispatch.Routed` is not
passed in: only the fields below are).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from honk.core.logs import FLOW_FIELD, kv
from honk.core.net import Address, Network

__all__ = ["FlowOpened", "format_chain", "log_flow_opened"]

log = logging.getLogger("honk.connection")


@dataclass(frozen=True, slots=True)
class FlowOpened:
    """A flow line's facts, for a view that writes its own shape (the Clash log stream)."""

    network: Network
    source: Address
    target: Address
    rule: str  # the router's rule text (honk.route.router.describe_rule), or a mode's
    chain: tuple[str, ...]  # the rule's target → … → the leaf
    spec: Any = None  # the Spec whose rules the rule text names (None: unknown)


def format_chain(chain: Sequence[str]) -> str:
    """A chain in honk's log lines: ``group>member>leaf`` (``-`` when empty)."""
    return ">".join(chain) if chain else "-"


def log_flow_opened(
    network: Network,
    inbound: str,
    source: Address,
    target: Address,
    rule: str,
    chain: tuple[str, ...],
    spec: Any = None,
) -> None:
    """The line of a flow that is established (a TCP flow registered, a UDP target routed and
    dialled); nothing is built when the honk logger drops info."""
    if not log.isEnabledFor(logging.INFO):
        return
    log.info(
        "flow opened %s",
        kv(
            network=network.value,
            inbound=inbound,
            source=source,
            target=target,
            rule=rule,
            chain=format_chain(chain),
        ),
        extra={FLOW_FIELD: FlowOpened(network, source, target, rule, chain, spec)},
    )
