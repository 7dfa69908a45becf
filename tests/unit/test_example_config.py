"""examples/config.toml says it explains every option: it loads as a config, and names every section
and top-level key the config has (commented out or not), so a new one cannot be left out."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from peerd.config import Config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "config.toml"


def test_the_example_loads_as_a_config() -> None:
    Config.model_validate(tomllib.loads(EXAMPLE.read_text()))


def test_the_example_names_every_section_and_key() -> None:
    text = EXAMPLE.read_text()
    named = set(re.findall(r"^#?\s*\[([a-z0-9_]+)[.\]]", text, re.M)) | set(
        re.findall(r"^#?\s*([a-z_]+)\s*=", text, re.M)
    )
    missing = sorted(set(Config.model_fields) - named - {"source"})  # source: where it was read from
    assert not missing, f"examples/config.toml does not name {missing}"
