"""Leaf outbounds: the ``Outbound`` contract (``base``), ``direct`` and ``block``; the proxy
leaves ``socks5``, ``http`` (also ``https://``) and ``shadowsocks``; VMess, VLESS and Trojan
(``vmess``, ``vless``, ``trojan`` on ``stacked``) over TCP, TLS or WebSocket (``transport``,
``tls``), optionally multiplexed on Mux.Cool carriers (``mux``, ``mux_udp``); what the leaves
share (``proxy``, ``channel``, ``bridge``, ``datagram``, ``stream_datagram``, a node's
``runtime`` and ``ready`` pool); and the ``registry`` that builds them from a Spec (a protocol
without a factory gets ``unsupported``'s stand-in)."""
