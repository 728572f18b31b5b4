"""The client side of a SOCKS5 handshake (RFC 1928, RFC 1929), without I/O.

:class:`Socks5ClientHandshake` is fed the server's bytes and says what to send
next. It never asks for more bytes than the current message holds
(:attr:`Socks5ClientHandshake.wanted`), so the glue can read exactly that many
and never swallow the first bytes of the relayed stream: some targets (SSH,
SMTP) speak first, and their greeting must reach the client intact.

Failures are typed for the node (``outbound`` is its name):

* malformed or unexpected bytes → :class:`DialError` phase ``handshake``;
* no acceptable method, or refused credentials → :class:`ProxyAuthFailed`;
* a reply other than success → :class:`TargetRefused` with the reply code.
"""

from __future__ import annotations

import enum

from honk.core.errors import DialError, HonkError, ProxyAuthFailed, TargetRefused
from honk.core.net import Address
from honk.proto.socks5 import (
    ATYP_DOMAIN,
    ATYP_IPV4,
    ATYP_IPV6,
    AUTH_VERSION,
    METHOD_NO_ACCEPTABLE,
    METHOD_NO_AUTH,
    METHOD_USERPASS,
    VERSION,
    Command,
    Reply,
    encode_address,
    parse_address,
)

__all__ = ["Socks5ClientHandshake", "encode_userpass"]

MAX_CREDENTIAL = 255  # RFC 1929: ULEN and PLEN are one byte each

_REPLY_NAMES = {int(r): r.name.lower().replace("_", " ") for r in Reply}


class _Step(enum.Enum):
    METHOD = "method"  # waiting for VER METHOD
    AUTH = "auth"  # waiting for the RFC 1929 status
    REPLY_HEAD = "reply-head"  # waiting for VER REP RSV ATYP
    REPLY_ADDR = "reply-addr"  # waiting for the rest of BND.ADDR and BND.PORT
    DONE = "done"
    FAILED = "failed"


def encode_userpass(username: str, password: str) -> bytes:
    """The RFC 1929 sub-negotiation request. Raises ValueError if a field is too long."""
    user = username.encode("utf-8")
    pw = password.encode("utf-8")
    if len(user) > MAX_CREDENTIAL or len(pw) > MAX_CREDENTIAL:
        raise ValueError("SOCKS5 user name and password are at most 255 bytes each")
    return bytes([AUTH_VERSION, len(user)]) + user + bytes([len(pw)]) + pw


class Socks5ClientHandshake:
    """One CONNECT or UDP ASSOCIATE handshake, greeting to reply.

    Usage: send :meth:`initial`; then, until :attr:`done`, read exactly
    :attr:`wanted` bytes, pass them to :meth:`feed` and send what it returns.
    """

    def __init__(
        self,
        outbound: str,
        command: Command,
        target: Address,
        username: str | None = None,
        password: str | None = None,
    ) -> None:
        self.outbound = outbound
        self.command = command
        self.target = target
        self._auth: bytes | None = None
        if username is not None:
            self._auth = encode_userpass(username, password or "")
        self._step = _Step.METHOD
        self._buf = bytearray()
        self._need = 2
        self.bound: Address | None = None  # BND.ADDR:BND.PORT of the success reply

    @property
    def done(self) -> bool:
        return self._step is _Step.DONE

    @property
    def wanted(self) -> int:
        """Bytes the current message still needs (0 once done)."""
        return self._need - len(self._buf)

    def initial(self) -> bytes:
        """The greeting: no-auth, or username/password when the node has credentials."""
        method = METHOD_USERPASS if self._auth is not None else METHOD_NO_AUTH
        return bytes([VERSION, 1, method])

    def feed(self, data: bytes) -> bytes:
        """Take server bytes (at most :attr:`wanted`); returns the bytes to send next."""
        if self._step is _Step.DONE or self._step is _Step.FAILED:
            raise ValueError("the handshake is over")
        if len(data) > self.wanted:
            raise ValueError("fed more bytes than the handshake wanted")
        self._buf += data
        if len(self._buf) < self._need:
            return b""
        message = bytes(self._buf)
        self._buf.clear()
        step = self._step
        try:
            if step is _Step.METHOD:
                return self._on_method(message)
            if step is _Step.AUTH:
                return self._on_auth(message)
            if step is _Step.REPLY_HEAD:
                return self._on_reply_head(message)
            return self._on_reply_addr(message)
        except HonkError:
            self._step = _Step.FAILED
            self._need = 0
            raise

    # -- steps ---------------------------------------------------------------------------

    def _on_method(self, message: bytes) -> bytes:
        if message[0] != VERSION:
            raise self._broken(f"server speaks version {message[0]}, not 5")
        method = message[1]
        if method == METHOD_NO_ACCEPTABLE:
            if self._auth is None:
                raise ProxyAuthFailed(self.outbound, "the proxy requires authentication")
            raise ProxyAuthFailed(self.outbound, "the proxy accepts no offered method")
        if method == METHOD_USERPASS and self._auth is not None:
            self._expect(_Step.AUTH, 2)
            return self._auth
        if method == METHOD_NO_AUTH:
            # A server may waive the credentials a node carries; RFC 1928 lets it choose.
            return self._request()
        raise self._broken(f"the proxy chose method {method:#04x}, which was not offered")

    def _on_auth(self, message: bytes) -> bytes:
        if message[0] != AUTH_VERSION:
            raise self._broken(f"authentication reply version {message[0]}, not 1")
        if message[1] != 0:
            raise ProxyAuthFailed(self.outbound, "the proxy refused the user name or password")
        return self._request()

    def _request(self) -> bytes:
        self._expect(_Step.REPLY_HEAD, 4)
        return bytes([VERSION, int(self.command), 0]) + encode_address(self.target)

    def _on_reply_head(self, head: bytes) -> bytes:
        if head[0] != VERSION:
            raise self._broken(f"reply version {head[0]}, not 5")
        code = head[1]
        if code != Reply.SUCCEEDED:
            name = _REPLY_NAMES.get(code, f"unknown reply {code:#04x}")
            raise TargetRefused(self.outbound, code, f"the proxy answered {code:#04x} ({name})")
        if head[2] != 0:
            raise self._broken("reserved byte of the reply is not zero")
        atyp = head[3]
        if atyp == ATYP_IPV4:
            rest = 4 + 2
        elif atyp == ATYP_IPV6:
            rest = 16 + 2
        elif atyp == ATYP_DOMAIN:
            rest = 1  # the length byte first; then the name and port
        else:
            raise self._broken(f"reply address type {atyp:#04x}")
        self._head = head
        self._expect(_Step.REPLY_ADDR, rest)
        return b""

    def _on_reply_addr(self, tail: bytes) -> bytes:
        if self._head[3] == ATYP_DOMAIN and len(tail) == 1:
            if tail[0] == 0:
                raise self._broken("empty domain in the reply")
            self._buf += tail
            self._need = 1 + tail[0] + 2
            return b""
        parsed = parse_address(self._head[3:4] + tail, 0)
        if parsed is None:
            raise self._broken("unreadable bound address in the reply")
        self.bound = parsed[0]
        self._step = _Step.DONE
        self._need = 0
        return b""

    # -- helpers -------------------------------------------------------------------------

    def _expect(self, step: _Step, size: int) -> None:
        self._step = step
        self._need = size

    def _broken(self, why: str) -> DialError:
        return DialError(self.outbound, "handshake", f"SOCKS5: {why}")
