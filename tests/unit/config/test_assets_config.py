"""The ``assets`` section (upstream honk's assets reference): the geodata download URLs and the
route downloads take, in the dae and TOML forms, and the located errors a bad value gets."""

from __future__ import annotations

from config_helpers import run

from honk.config.spec import AssetsSpec, GeodataSpec

HEAD = """global {
    data_dir: ./var
}
node {
    relay: 'socks5://127.0.0.1:1080'
}
group {
    proxy {
        filter: name(relay)
    }
}
routing {
    fallback: direct
}
"""
SITE = "https://mirror.example/geosite.dat"
IP = "https://mirror.example/rules/geoip.dat?token=abc"


def test_the_dae_block_gives_both_urls_and_the_geodata_route() -> None:
    out = run(
        HEAD
        + f"""assets {{
    route: proxy
    geodata {{
        geosite: '{SITE}'
        geoip: "{IP}"
        route: relay
    }}
}}
"""
    )
    assert out.error is None, out.diagnostics
    assert out.spec is not None
    assert out.spec.assets == AssetsSpec(route="proxy", geodata=GeodataSpec(SITE, IP, "relay"))


def test_the_toml_tables_mean_the_same_as_the_dae_block() -> None:
    toml = f"""[global]
data_dir = "./var"
[node]
relay = "socks5://127.0.0.1:1080"
[group.proxy]
filter = ["name(relay)"]
[routing]
fallback = "direct"
[assets]
route = "proxy"
[assets.geodata]
geosite = "{SITE}"
geoip = "{IP}"
route = "relay"
"""
    out = run(toml, "toml")
    assert out.error is None, out.diagnostics
    assert out.spec is not None
    assert out.spec.assets == AssetsSpec(route="proxy", geodata=GeodataSpec(SITE, IP, "relay"))


def test_without_a_geodata_route_downloads_take_the_assets_route_then_routing() -> None:
    out = run(HEAD + f"assets {{\n    route: direct\n    geodata {{\n        geosite: '{SITE}'\n    }}\n}}\n")
    assert out.spec is not None and out.spec.assets.geodata.route == "direct"
    assert out.spec.assets.geodata.geoip is None
    out = run(HEAD + f"assets {{\n    geodata {{\n        geoip: '{IP}'\n    }}\n}}\n")
    assert out.spec is not None and out.spec.assets.geodata.route == "routing"


def test_a_file_without_the_section_configures_no_url() -> None:
    out = run(HEAD)
    assert out.spec is not None and out.spec.assets == AssetsSpec()
    assert out.spec.assets.geodata.url("geosite") is None and out.spec.assets.geodata.route == "routing"


def test_a_non_http_url_is_an_error_naming_its_key_path_and_line() -> None:
    out = run(HEAD + "assets {\n    geodata {\n        geoip: 'ftp://mirror.example/geoip.dat'\n    }\n}\n")
    assert out.error is not None
    [diag] = out.find("invalid-url")
    assert diag.key_path == "assets.geodata.geoip"
    assert diag.loc.line == HEAD.count("\n") + 3
    assert "ftp" not in diag.message  # the value is never echoed


def test_a_url_with_a_password_or_fragment_is_refused() -> None:
    for url in ("https://user:pw@mirror.example/geosite.dat", "https://mirror.example/geosite.dat#x"):
        out = run(HEAD + f"assets {{\n    geodata {{\n        geosite: '{url}'\n    }}\n}}\n")
        assert [d.key_path for d in out.find("invalid-url")] == ["assets.geodata.geosite"], url
        assert "pw" not in str(out.error)


def test_a_url_longer_than_upstreams_limit_is_refused() -> None:
    url = "https://mirror.example/" + "a" * 4096
    out = run(HEAD + f"assets {{\n    geodata {{\n        geosite: '{url}'\n    }}\n}}\n")
    assert [d.key_path for d in out.find("invalid-url")] == ["assets.geodata.geosite"]


def test_a_route_naming_no_node_or_group_is_an_error_with_its_line() -> None:
    out = run(HEAD + "assets {\n    route: nowhere\n    geodata {\n        route: nothere\n    }\n}\n")
    assert out.error is not None
    found = {d.key_path: d.loc.line for d in out.find("unknown-outbound")}
    base = HEAD.count("\n")
    assert found == {"assets.route": base + 2, "assets.geodata.route": base + 4}


def test_a_toml_error_carries_the_line_of_its_key() -> None:
    toml = '[routing]\nfallback = "direct"\n\n[assets.geodata]\ngeosite = "gopher://x/geosite.dat"\n'
    out = run(toml, "toml")
    [diag] = out.find("invalid-url")
    assert diag.key_path == "assets.geodata.geosite" and diag.loc.line == 5


def test_upstreams_ui_and_subscription_blocks_are_warned_about_not_refused() -> None:
    out = run(
        HEAD
        + """assets {
    ui {
        url: 'https://mirror.example/dashboard.zip'
    }
    subscription {
        ua: 'clash.meta'
    }
    colour: blue
}
"""
    )
    assert out.error is None and out.spec is not None
    assert {d.key_path for d in out.find("not-honoured")} == {"assets.ui.url", "assets.subscription.ua"}
    assert [d.key_path for d in out.find("unknown-key")] == ["assets.colour"]


def test_an_empty_url_means_not_configured() -> None:
    out = run(HEAD + "assets {\n    geodata {\n        geosite: ''\n    }\n}\n")
    assert out.spec is not None and out.spec.assets.geodata.geosite is None


def test_the_url_stays_out_of_the_specs_repr() -> None:
    out = run(HEAD + f"assets {{\n    geodata {{\n        geoip: '{IP}'\n    }}\n}}\n")
    assert out.spec is not None and "token=abc" not in repr(out.spec)
