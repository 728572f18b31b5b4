import sys
from pathlib import Path

# Make `tests.helpers` importable as `helpers` from any test module.
sys.path.insert(0, str(Path(__file__).parent))


import pytest  # noqa: E402
from helpers.geodata import write_geodata  # noqa: E402


@pytest.fixture
def geodata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A geosite.dat and geoip.dat the test built (helpers.geodata), found first through dae's
    DAE_LOCATION_ASSET as a configuration's rules would find them."""
    directory = write_geodata(tmp_path / "geodata")
    monkeypatch.setenv("DAE_LOCATION_ASSET", str(directory))
    return directory


@pytest.fixture
def no_geodata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No geodata anywhere but where the test puts it: the environment, the working directory
    (``tmp_path``), XDG and the system asset directories all point at empty places."""
    from honk.geo import assets

    monkeypatch.setattr(assets, "HONK_ASSET_DIRS", (str(tmp_path / "honk-share"),))
    monkeypatch.setattr(assets, "SYSTEM_ASSET_DIRS", (str(tmp_path / "system"),))
    monkeypatch.delenv("DAE_LOCATION_ASSET", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    return tmp_path
