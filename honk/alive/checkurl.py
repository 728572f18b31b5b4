"""The health probe's URL: what is dialled, what goes in ``Host`` and what path is requested.

Why not :mod:`urllib.parse`: the probe must send the configured path exactly as
written (dot segments and percent-escapes included) and must refuse shapes that
urllib quietly accepts or repairs (backslashes, ``http:///host``, embedded
whitespace). So the URL is split here by hand, following RFC 3986's grammar:

  * ``scheme://`` is optional; a URL without one uses ``default_scheme`` (HTTP).
    Only ``http`` and ``https`` are accepted; they default to ports 80 and 443.
  * Userinfo (``user:pw@``) is dropped: the probe sends no credentials.
  * A bracketed host is an IPv6 literal; the brackets stay in the ``Host`` value
    (``authority``) and go from ``host``, which dials and names the TLS server.
  * The port is kept in ``authority`` only when it is not the scheme's default.
  * The fragment is dropped; a path-less URL asks for ``/`` (``/?q`` when only a
    query is given). Non-ASCII characters, which HTTP cannot carry, are
    percent-encoded as UTF-8; everything else is sent as written.

A :class:`ValueError` never repeats the URL, which may hold a token.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = ["DEFAULT_DELAY_URL", "DEFAULT_PORTS", "CheckUrl", "parse_check_url"]

DEFAULT_DELAY_URL = (
    "https://www.gstatic.com/generate_204"  # "An empty delay URL uses https://www.gstatic.com/generate_204"
)
DEFAULT_PORTS = {"http": 80, "https": 443}  # "Explicit HTTP/HTTPS default to 80/443"

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
_REG_NAME = re.compile(r"[A-Za-z0-9._-]+")  # a DNS name or an IPv4 literal, as the probe dials it
_PORT = re.compile(r"[0-9]{0,5}")


@dataclass(frozen=True, slots=True)
class CheckUrl:
    """A parsed health-check URL.

    ``host`` is unbracketed (it is dialled and names the TLS server); ``authority``
    is the ``Host`` / ``:authority`` value; ``target`` is the path and query as sent.
    """

    scheme: str  # "http" | "https"
    host: str
    port: int
    authority: str
    target: str
    tls: bool


def parse_check_url(text: str, *, default_scheme: str = "http") -> CheckUrl:
    """Split ``text`` into a :class:`CheckUrl`; raise :class:`ValueError` if it is not one."""
    if default_scheme not in DEFAULT_PORTS:
        raise ValueError("the default scheme must be http or https")
    if any(c <= " " or c == "\x7f" for c in text):
        raise ValueError("check URL holds whitespace or a control character")
    if "\\" in text:
        raise ValueError("check URL holds a backslash")
    scheme, rest = _split_scheme(text, default_scheme)
    if rest.startswith("/"):
        raise ValueError("check URL has surplus slashes before its authority")
    end = len(rest)
    for delimiter in "/?#":
        at = rest.find(delimiter)
        if at != -1:
            end = min(end, at)
    authority, tail = rest[:end], rest[end:]
    host, bracketed, port_text = _split_authority(authority.rpartition("@")[2])
    if not _PORT.fullmatch(port_text):
        raise ValueError("check URL has an invalid port")
    port = int(port_text) if port_text else DEFAULT_PORTS[scheme]
    if not 0 < port <= 65535:
        raise ValueError("check URL port is out of range")
    shown = f"[{host}]" if bracketed else host
    if port != DEFAULT_PORTS[scheme]:
        shown = f"{shown}:{port}"
    return CheckUrl(scheme, host, port, shown, _request_target(tail), scheme == "https")


def _split_scheme(text: str, default_scheme: str) -> tuple[str, str]:
    """(scheme, what follows ``scheme://``); a URL without ``://`` after its scheme-like head has none."""
    m = _SCHEME.match(text)
    if m is not None:
        scheme = m.group(1).lower()
        after = text[m.end() :]
        if after.startswith("//"):
            if scheme not in DEFAULT_PORTS:
                raise ValueError("check URL scheme must be http or https")
            return scheme, after[2:]
        if scheme in DEFAULT_PORTS:  # "http:host", "http:/host"
            raise ValueError("check URL scheme is not followed by //")
        # "host:port/...": a schemeless URL whose host looks like a scheme
    return default_scheme, text


def _split_authority(hostport: str) -> tuple[str, bool, str]:
    """(unbracketed host, whether it was bracketed, port text) of ``host[:port]``."""
    if hostport.startswith("["):
        close = hostport.find("]")
        if close == -1:
            raise ValueError("check URL has an unclosed IPv6 bracket")
        host, after = hostport[1:close], hostport[close + 1 :]
        if after and not after.startswith(":"):
            raise ValueError("check URL has text after its IPv6 literal")
        try:
            if "%" in host:  # a zone index ("%25eth0") names an interface of this host only
                raise ValueError
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ValueError("check URL has an invalid IPv6 literal") from None
        return host, True, after[1:]
    host, _, port_text = hostport.partition(":")
    if ":" in port_text:
        raise ValueError("check URL has an unbracketed IPv6 literal or a second port")
    if not host:
        raise ValueError("check URL has no host")
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")  # an internationalised name as DNS and Host need it
        except UnicodeError:
            raise ValueError("check URL has an invalid international host name") from None
    if not _REG_NAME.fullmatch(host):
        raise ValueError("check URL host holds characters a host name cannot")
    return host, False, port_text


def _request_target(tail: str) -> str:
    """The path and query of ``tail`` (what follows the authority), fragment dropped."""
    path_query = tail.partition("#")[0]
    if not path_query.startswith("/"):
        path_query = "/" + path_query  # "" -> "/", "?q" -> "/?q"
    if path_query.isascii():
        return path_query
    try:
        return "".join(
            c if c.isascii() else "".join(f"%{b:02X}" for b in c.encode("utf-8")) for c in path_query
        )
    except UnicodeEncodeError:  # a lone surrogate
        raise ValueError("check URL path is not valid text") from None
