"""v2ray configs and node links for the benchmark's VMess, Trojan and VLESS rows.

Pure functions, no process is started here: :mod:`benchmarks.relay` writes what
they return and runs v2ray on it. Each tag names its protocol and how it is
carried, as the relay issue measures it:

* ``vmess``: VMess over plain TCP, body cipher aes-128-gcm, alterId 0 (AEAD header);
* ``trojan``: Trojan over TLS;
* ``vless``: VLESS over TLS, no flow (decryption/encryption none);
* ``trojan_ws``: Trojan over WebSocket (path :data:`WS_PATH`) over TLS;
* ``vmess_tls``: VMess (as ``vmess``) over TLS;
* ``vmess_ws``: VMess (as ``vmess``) over WebSocket over TLS, the common VMess deployment.

``secret`` is the user id (a UUID) for VMess and VLESS and the password for Trojan.
The TLS certificate is issued for ``localhost`` and 127.0.0.1; clients ask for
``localhost`` (:data:`SERVER_NAME`). Access logs are off on both ends so that a
connection costs v2ray no more than the relay itself.
"""

from __future__ import annotations

import base64
import json

LOOPBACK = "127.0.0.1"
SERVER_NAME = "localhost"
TLS_NAMES = (SERVER_NAME, LOOPBACK)
VMESS_SECURITY = "aes-128-gcm"
TAGS = ("vmess", "trojan", "vless", "trojan_ws", "vmess_tls", "vmess_ws")
_PROTOCOL = {
    "vmess": "vmess",
    "trojan": "trojan",
    "vless": "vless",
    "trojan_ws": "trojan",
    "vmess_tls": "vmess",
    "vmess_ws": "vmess",
}  # v2ray's name
_TLS_TAGS = frozenset({"trojan", "vless", "trojan_ws", "vmess_tls", "vmess_ws"})
_WS_TAGS = frozenset({"trojan_ws", "vmess_ws"})
WS_PATH = "/bench-ws"
_LOG = {"loglevel": "warning", "access": "none"}  # "none": no access log at all (empty would mean stdout)


def uses_tls(tag: str) -> bool:
    return _check(tag) in _TLS_TAGS


def protocol(tag: str) -> str:
    """The tag's protocol, as v2ray names it."""
    return _PROTOCOL[_check(tag)]


def describe(tag: str) -> str:
    """How the tag's protocol is carried, for the subject notes."""
    return {
        "vmess": f"VMess/TCP {VMESS_SECURITY}",
        "trojan": "Trojan/TLS",
        "vless": "VLESS/TLS",
        "trojan_ws": "Trojan/WebSocket/TLS",
        "vmess_tls": f"VMess/TLS {VMESS_SECURITY}",
        "vmess_ws": f"VMess/WebSocket/TLS {VMESS_SECURITY}",
    }[_check(tag)]


def _stream(tag: str, tls: bool, tls_settings: dict[str, object]) -> dict[str, object]:
    stream: dict[str, object] = {
        "network": "ws" if tag in _WS_TAGS else "tcp",
        "security": "tls" if tls else "none",
    }
    if tag in _WS_TAGS:
        stream["wsSettings"] = {"path": WS_PATH}
    if tls:
        stream["tlsSettings"] = tls_settings
    return stream


def server_config(
    tag: str, port: int, secret: str, cert_file: str = "", key_file: str = "", *, tls: bool | None = None
) -> dict[str, object]:
    """The sink: ``tag``'s inbound on loopback ``port``, everything out through ``freedom``;
    ``tls`` puts it over TLS (default: only the tags that always run over it)."""
    clients = {
        "vmess": [{"id": secret, "alterId": 0}],
        "trojan": [{"password": secret}],
        "vless": [{"id": secret}],
    }
    settings: dict[str, object] = {"clients": clients[protocol(tag)]}
    if tag == "vless":
        settings["decryption"] = "none"
    over_tls = uses_tls(tag) if tls is None else tls
    if over_tls and not (cert_file and key_file):
        raise ValueError(f"{tag} runs over TLS: give the certificate and key files")
    stream = _stream(tag, over_tls, {"certificates": [{"certificateFile": cert_file, "keyFile": key_file}]})
    return {
        "log": _LOG,
        "inbounds": [
            {
                "listen": LOOPBACK,
                "port": port,
                "protocol": protocol(tag),
                "settings": settings,
                "streamSettings": stream,
            }
        ],
        "outbounds": [{"protocol": "freedom", "settings": {}}],
    }


def client_config(
    tag: str,
    port: int,
    server_port: int,
    secret: str,
    ca_file: str = "",
    *,
    tls: bool | None = None,
    mux: bool = False,
) -> dict[str, object]:
    """The reference client: a SOCKS5 inbound (no auth) on ``port``, ``tag``'s outbound to the sink
    (with Mux.Cool when ``mux``).

    Over TLS (``tls``, as for :func:`server_config`) it trusts ``ca_file`` (on top of the system's
    store) and asks for :data:`SERVER_NAME`.
    """
    if protocol(tag) == "trojan":
        server = {"address": LOOPBACK, "port": server_port, "password": secret}
        settings: dict[str, object] = {"servers": [server]}
    else:
        user: dict[str, object] = (
            {"id": secret, "alterId": 0, "security": VMESS_SECURITY}
            if protocol(tag) == "vmess"
            else {"id": secret, "encryption": "none"}
        )
        settings = {"vnext": [{"address": LOOPBACK, "port": server_port, "users": [user]}]}
    over_tls = uses_tls(tag) if tls is None else tls
    if over_tls and not ca_file:
        raise ValueError(f"{tag} runs over TLS: give the CA file the client trusts")
    stream = _stream(
        tag,
        over_tls,
        {
            "serverName": SERVER_NAME,
            "allowInsecure": False,
            "certificates": [{"usage": "verify", "certificateFile": ca_file}],
        },
    )
    return {
        "log": _LOG,
        "inbounds": [
            {
                "listen": LOOPBACK,
                "port": port,
                "protocol": "socks",
                "settings": {"auth": "noauth", "udp": False},
            }
        ],
        "outbounds": [
            {
                "protocol": protocol(tag),
                "settings": settings,
                "streamSettings": stream,
                "mux": {"enabled": mux},
            }
        ],
    }


def share_link(tag: str, server_port: int, secret: str, *, tls: bool = False) -> str:
    """The node link honk is given for the sink: v2rayN's base64 JSON for VMess (over TLS when
    ``tls`` or the tag always is), URLs for the others."""
    if protocol(tag) == "vmess":
        tls = tls or uses_tls(tag)
        fields = {
            "v": "2",
            "ps": "sink",
            "add": LOOPBACK,
            "port": str(server_port),
            "id": secret,
            "aid": "0",
            "scy": VMESS_SECURITY,
            "net": "ws" if tag in _WS_TAGS else "tcp",
            "type": "none",
            "tls": "tls" if tls else "",
            "sni": SERVER_NAME if tls else "",
        }
        if tag in _WS_TAGS:
            fields["path"] = WS_PATH
        return "vmess://" + base64.b64encode(json.dumps(fields).encode()).decode()
    params = f"security=tls&sni={SERVER_NAME}&" + (
        f"type=ws&path={WS_PATH}" if tag in _WS_TAGS else "type=tcp"
    )
    if protocol(tag) == "trojan":
        return f"trojan://{secret}@{LOOPBACK}:{server_port}?{params}#sink"
    return f"vless://{secret}@{LOOPBACK}:{server_port}?{params}&encryption=none#sink"


def _check(tag: str) -> str:
    if tag not in TAGS:
        raise ValueError(f"v2ray tag must be one of {TAGS}, not {tag!r}")
    return tag
