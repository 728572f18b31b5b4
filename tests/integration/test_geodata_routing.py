"""A real ``honk run`` routing by geodata the test built (v2fly's GeoSiteList/GeoIPList,
tests/helpers/geodata.py): the configuration's ``domain(geosite: …)``, ``dip(geoip: …)``,
``@attr`` and ``ext:`` rules decide real SOCKS5 flows, the files found in ``data_dir`` as dae
users keep them; a SIGHUP after the data changed reroutes new flows."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from helpers.geodata import geoip_bytes, geosite_bytes
from helpers.proc import HonkProcess
from helpers.servers import EchoServer
from helpers.sockets import roundtrip
from helpers.socks import socks5_connect

from honk.geo import dat

SOCKS_REPLY_NOT_ALLOWED = 0x02

CONFIG = """global {
    log_level: info
    data_dir: ./var
}
inbound {
    lan: 'mixed://127.0.0.1:0'
}
routing {
    domain(geosite: category-ads-all@ads) -> block
    domain(ext: "extra.dat:games") -> block
    domain(geosite: mine) -> direct
    dip(geoip: mine) -> direct
    fallback: block
}
"""


def _write_data(var: Path, loopback_name: str, loopback_cidr: str) -> None:
    var.mkdir(exist_ok=True)
    (var / "geosite.dat").write_bytes(
        geosite_bytes(
            {
                "MINE": [(dat.FULL, loopback_name, ())],
                "CATEGORY-ADS-ALL": [(dat.DOMAIN, "ads.example", ("ads",)), (dat.FULL, "localhost", ())],
            }
        )
    )
    (var / "geoip.dat").write_bytes(geoip_bytes({"MINE": ([loopback_cidr], False)}))
    (var / "extra.dat").write_bytes(geosite_bytes({"GAMES": [(dat.DOMAIN, "games.example", ())]}))


def test_geosite_geoip_attr_and_ext_rules_route_real_flows_and_a_reload_reads_new_data(tmp_path):
    cfg = tmp_path / "honk.dae"
    cfg.write_text(CONFIG)
    _write_data(tmp_path / "var", "localhost", "127.0.0.0/8")
    env = {k: v for k, v in os.environ.items() if k != "DAE_LOCATION_ASSET"}
    with EchoServer() as echo, HonkProcess(cfg, env=env) as honk:
        proxy = honk.inbound()
        by_name, rep = socks5_connect(proxy, "localhost", echo.port)  # geosite: mine (full name)
        assert rep == 0 and roundtrip(by_name, b"geosite") == b"geosite"
        by_ip, rep = socks5_connect(proxy, "127.0.0.1", echo.port)  # geoip: mine
        assert rep == 0 and roundtrip(by_ip, b"geoip") == b"geoip"
        ads, rep = socks5_connect(proxy, "x.ads.example", 80)  # only the @ads entries block
        assert rep == SOCKS_REPLY_NOT_ALLOWED
        ads.close()
        game, rep = socks5_connect(proxy, "eu.games.example", 443)  # ext: another file's list
        assert rep == SOCKS_REPLY_NOT_ALLOWED
        game.close()

        _write_data(tmp_path / "var", "not-localhost.example", "192.0.2.0/24")  # loopback leaves both lists
        for name in ("geosite.dat", "geoip.dat"):
            os.utime(tmp_path / "var" / name, ns=(9, 9))
        mark = honk.mark()
        honk.signal(signal.SIGHUP)
        honk.wait_for(r"config reloaded: built \[route\]", after=mark)
        fresh, rep = socks5_connect(proxy, "localhost", echo.port)  # now the fallback: block
        assert rep == SOCKS_REPLY_NOT_ALLOWED
        fresh.close()
        assert roundtrip(by_name, b"kept") == b"kept"  # the flow opened before goes on
        by_name.close()
        by_ip.close()
