"""The global ``response_timeout`` key (issue 32): honk's own, its default, both syntaxes, off
with 0, and a located warning for a duration that is not one (read as 0, as every duration)."""

from __future__ import annotations

from honk.config.load import load_text
from honk.config.spec import DEFAULT_RESPONSE_TIMEOUT, GlobalSpec


def test_the_default_response_timeout_is_ten_seconds():
    assert GlobalSpec().response_timeout == DEFAULT_RESPONSE_TIMEOUT == 10.0
    assert load_text("global {\n    log_level: info\n}\n", "dae").global_.response_timeout == 10.0


def test_dae_and_toml_spell_the_same_response_timeout():
    dae = load_text("global {\n    response_timeout: 4s\n}\n", "dae").global_
    toml = load_text('[global]\nresponse_timeout = "4s"\n', "toml").global_
    assert dae.response_timeout == toml.response_timeout == 4.0


def test_zero_turns_the_response_deadline_off():
    assert load_text("global {\n    response_timeout: 0s\n}\n", "dae").global_.response_timeout == 0.0


def test_a_negative_response_timeout_is_read_as_off_with_a_located_warning():
    spec = load_text("global {\n    response_timeout: -3s\n}\n", "dae")
    assert spec.global_.response_timeout == 0.0
    [warning] = [d for d in spec.diagnostics if d.key_path == "global.response_timeout"]
    assert warning.loc.line == 2 and warning.code == "invalid-duration"
