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
