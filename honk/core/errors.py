"""Typed errors.

Every error honk raises on purpose derives from :class:`HonkError`. Errors are
typed by *who* broke something: the client (LAN side), the upstream (remote
side), or the configuration. Messages never contain configuration values that
could be secrets.
"""

from __future__ import annotations


class HonkError(Exception):
    """Base class for every error honk raises on purpose."""


# --- client side (inbound) -------------------------------------------------


class ClientProtocolError(HonkError):
    """The client sent bytes that its protocol does not allow.

    ``protocol`` names the inbound protocol (``socks5``, ``http``, ``mixed``);
    ``reason`` is a short stable slug such as ``bad-version`` or
    ``header-too-large`` that logs and metrics can count.
    """

    def __init__(self, protocol: str, reason: str, detail: str = "") -> None:
        text = f"{protocol}: {reason}" + (f" ({detail})" if detail else "")
        super().__init__(text)
        self.protocol = protocol
        self.reason = reason


class CodecError(HonkError):
    """A proxy protocol's codec refused bytes or settings (a subclass per protocol names it).

    ``reason`` is a short stable slug such as ``bad-tag`` or ``no-response`` that
    logs and metrics can count; ``detail`` only adds words to the message.
    """

    protocol = "codec"  # each protocol's subclass says its name, which leads the message
    # the node's framing, authentication or carrier broke, for every flow on it (Score scopes
    # it to the node); False for an error that ends one flow only (a mux session's reset)
    carrier_wide = True

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{self.protocol}: {reason}" + (f" ({detail})" if detail else ""))
        self.reason = reason


class ClientGone(HonkError):
    """The client closed, reset or stopped answering before the flow finished."""


class HandshakeTimeout(HonkError):
    """The client did not finish its proxy handshake within the deadline."""


class AuthenticationFailed(HonkError):
    """The client's credentials were refused by an inbound."""


# --- routing and dialing -----------------------------------------------------


class Blocked(HonkError):
    """The flow was routed to ``block``; the inbound answers with its refusal."""


class NoRoute(HonkError):
    """A group resolved to no dialable leaf (missing member, empty group, cycle)."""


class DialError(HonkError):
    """An outbound could not establish the upstream connection.

    ``phase`` is one of ``resolve``, ``connect``, ``tls``, ``handshake``,
    ``auth``, ``target``; ``outbound`` is the leaf's name.
    """

    def __init__(self, outbound: str, phase: str, message: str) -> None:
        super().__init__(f"{outbound}: {phase}: {message}")
        self.outbound = outbound
        self.phase = phase


class DialTimeout(DialError):
    """The dial deadline passed before the upstream connection was ready."""


class ProxyAuthFailed(DialError):
    """The proxy refused the node's credentials (phase ``auth``)."""

    def __init__(self, outbound: str, message: str) -> None:
        super().__init__(outbound, "auth", message)


class TargetRefused(DialError):
    """The proxy is fine but would not reach the target (phase ``target``).

    ``reply`` is the refusal as a SOCKS5 reply code (an HTTP proxy's status is
    mapped onto one), so a SOCKS5 inbound can pass it on unchanged.
    """

    def __init__(self, outbound: str, reply: int, message: str) -> None:
        super().__init__(outbound, "target", message)
        self.reply = reply


class ConfigRefused(HonkError):
    """The node's configuration cannot be dialled (an unsupported option, for example)."""


class CapacityRefused(HonkError):
    """A local limit refused the dial (sessions, sockets, ports): nothing was sent upstream."""


class NotSupported(HonkError):
    """The outbound cannot carry this kind of flow (for example UDP)."""


# --- relay -----------------------------------------------------------------


class RelayError(HonkError):
    """A relay ended abnormally; the subclass says which side."""


class UpstreamFailed(RelayError):
    """The upstream side reset or failed while relaying."""


class IdleTimeout(RelayError):
    """No byte moved in either direction for the idle timeout."""


class FlowClosed(RelayError):
    """The flow was closed on purpose (shutdown, interrupt, operator)."""


class HalfCloseTimeout(FlowClosed):
    """One direction of the flow had ended and nothing moved either way for the half-close
    timeout: honk closed the rest. honk's own decision, so it is neutral for the node."""


# The exact text a drained flow ends with (requirement RL-48): logs and the API show it as is.
OUTBOUND_DRAINED_TEXT = "the outbound this flow was opened on was drained"


class OutboundDrained(FlowClosed):
    """The outbound version the flow was opened on left service and its drain closed the flow.

    A closing on purpose, not an upstream failure: it never counts against the node's health."""

    def __init__(self) -> None:
        super().__init__(OUTBOUND_DRAINED_TEXT)
