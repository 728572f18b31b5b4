"""include {}: globs, merge order, confinement and cycles."""

from __future__ import annotations

import pytest

from honk.config.diagnostics import ConfigError
from honk.config.load import load_file, load_text


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_includes_merge_in_order_and_later_scalars_override(tmp_path):
    entry = _write(
        tmp_path / "main.dae",
        "include {\n    'conf.d/*.dae'  extra.dae\n}\nglobal {\n    log_level: debug\n}\n"
        "node {\n    a: socks5://10.0.0.1:1\n}\n",
    )
    _write(tmp_path / "conf.d" / "20-b.dae", "node {\n    c: socks5://10.0.0.3:1\n}\n")
    _write(
        tmp_path / "conf.d" / "10-a.dae",
        "node {\n    b: socks5://10.0.0.2:1\n}\nglobal {\n    log_level: warn\n}\n",
    )
    _write(tmp_path / "conf.d" / "ignored.toml", "x = 1\n")
    _write(tmp_path / "extra.dae", "# only a comment\n")
    spec = load_file(entry)
    assert [n.name for n in spec.nodes] == ["a", "b", "c"]
    assert spec.global_.log_level == "warn"
    assert spec.source == str(entry)


def test_diagnostics_from_an_included_file_name_that_file(tmp_path):
    entry = _write(tmp_path / "main.dae", "include {\n    inc.dae\n}\nglobal {\n}\n")
    inc = _write(tmp_path / "inc.dae", "global {\n    colour: red\n}\n")
    spec = load_file(entry)
    (d,) = spec.diagnostics
    assert d.code == "unknown-key" and d.loc.file == str(inc) and d.loc.line == 2


def test_include_cycle_is_an_error_at_the_include_line(tmp_path):
    a = _write(tmp_path / "a.dae", "global {\n}\ninclude {\n    b.dae\n}\n")
    b = _write(tmp_path / "b.dae", "include {\n    a.dae\n}\n")
    with pytest.raises(ConfigError) as info:
        load_file(a)
    (d,) = info.value.errors
    assert (d.code, d.key_path, d.loc.file, d.loc.line) == ("include-cycle", "include[0]", str(b), 2)


def test_include_outside_the_entry_directory_is_rejected(tmp_path):
    _write(tmp_path / "outside.dae", "global {\n}\n")
    entry = _write(tmp_path / "sub" / "main.dae", "global {\n}\ninclude {\n    ../outside.dae\n}\n")
    with pytest.raises(ConfigError) as info:
        load_file(entry)
    assert [(d.code, d.loc.line) for d in info.value.errors] == [("include-outside", 4)]


def test_include_in_text_without_base_dir_is_an_error():
    with pytest.raises(ConfigError) as info:
        load_text("include {\n    a.dae\n}\nglobal {\n}\n", "dae")
    assert info.value.errors[0].code == "include-without-base"


def test_toml_includes_and_json_entry(tmp_path):
    entry = _write(tmp_path / "main.toml", 'include = ["parts/*.toml"]\n[node]\na = "socks5://10.0.0.1:1"\n')
    _write(tmp_path / "parts" / "x.toml", '[node]\nb = "socks5://10.0.0.2:1"\n[routing]\nfallback = "b"\n')
    spec = load_file(entry)
    assert [n.name for n in spec.nodes] == ["a", "b"]
    assert spec.routing.fallback == "b"
    j = _write(tmp_path / "cfg.json", '{"include": ["missing/*.json"]}')
    assert [d.code for d in load_file(j).diagnostics] == ["include-not-found"]


def test_unknown_extension_and_unreadable_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_file(tmp_path / "c.yaml")
    assert info.value.errors[0].code == "unknown-format"
    with pytest.raises(ConfigError) as info:
        load_file(tmp_path / "nope.dae")
    assert info.value.errors[0].code == "unreadable"
