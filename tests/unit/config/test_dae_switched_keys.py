"""dae reads utls_imitate only with tls_implementation: utls, and the TLS fragment sizes only
with tls_fragment: true (dae's example.dae: "This takes effect only if tls_implementation is
utls"). Left at their feature's default, they change nothing in dae either, so honk says
nothing; with the feature on, honk's counted warning names each key it does not honour."""

from __future__ import annotations

import pytest

from honk.config.diagnostics import Severity
from honk.config.load import load_text

NODE = "node {\n    n1: 'socks5://192.0.2.1:1080'\n}\nrouting {\n    fallback: n1\n}\n"


def warned(global_lines: str) -> list[str]:
    spec = load_text("global {\n" + global_lines + "}\n" + NODE, "dae")
    return [d.key_path for d in spec.diagnostics if d.severity is Severity.WARNING]


@pytest.mark.parametrize(
    "lines",
    [
        "    utls_imitate: chrome_auto\n",
        "    tls_implementation: tls\n    utls_imitate: chrome_auto\n",
        "    tls_fragment: false\n    tls_fragment_length: '50-100'\n    tls_fragment_interval: '10-20'\n",
    ],
)
def test_a_key_whose_dae_feature_is_off_is_accepted_without_a_warning(lines):
    assert warned(lines) == []


def test_utls_imitate_with_utls_switched_on_is_a_counted_warning_beside_it():
    assert warned("    tls_implementation: utls\n    utls_imitate: chrome_auto\n") == [
        "global.tls_implementation",
        "global.utls_imitate",
    ]


def test_fragment_sizes_with_fragmenting_switched_on_are_counted_warnings():
    assert warned("    tls_fragment: true\n    tls_fragment_length: '50-100'\n") == [
        "global.tls_fragment",
        "global.tls_fragment_length",
    ]
