"""A real TLS ClientHello, from Python's own TLS client, for tests of what sniffing finds."""

from __future__ import annotations

import ssl


def client_hello(server_name: str | None) -> bytes:
    """The first flight of a TLS client naming ``server_name`` (None: no SNI): the bytes a
    transparent proxy sees first on a connection to port 443."""
    context = ssl.create_default_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=server_name)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:  # waiting for the server's answer: the hello is out
        return outgoing.read()
    raise AssertionError("a TLS handshake completed without a server")
