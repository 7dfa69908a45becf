"""The config file: defaults, strict keys, custom commands, secrets hidden when shown."""

from __future__ import annotations

from pathlib import Path

import pytest

from peerd.config import HIDDEN, default_path, load
from peerd.errors import ConfigInvalid


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text)
    return path


def test_a_missing_file_is_the_defaults_unless_named(tmp_path: Path) -> None:
    config = load(tmp_path / "none.toml")
    assert config.providers == {} and config.tls and config.listen is None
    with pytest.raises(ConfigInvalid, match="No config file"):
        load(tmp_path / "none.toml", required=True)


def test_the_default_path_follows_xdg(tmp_path: Path) -> None:
    assert default_path({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "peerd" / "config.toml"
    assert default_path({"PEERD_CONFIG": str(tmp_path / "x.toml")}) == tmp_path / "x.toml"


def test_a_named_home_has_its_own_config_file(tmp_path: Path) -> None:
    xdg = {"XDG_CONFIG_HOME": str(tmp_path / "xdg")}
    assert default_path(xdg, home=tmp_path / "box") == tmp_path / "box" / "config.toml"
    assert default_path({**xdg, "PEERD_HOME": str(tmp_path / "env")}) == tmp_path / "env" / "config.toml"
    # --home wins over PEERD_HOME, as it does for the data; PEERD_CONFIG (--config) over both.
    both = {**xdg, "PEERD_HOME": str(tmp_path / "env")}
    assert default_path(both, home=tmp_path / "box") == tmp_path / "box" / "config.toml"
    named = {**both, "PEERD_CONFIG": str(tmp_path / "x.toml")}
    assert default_path(named, home=tmp_path / "box") == tmp_path / "x.toml"
    (tmp_path / "box").mkdir()
    (tmp_path / "box" / "config.toml").write_text('label = "box"\n')
    loaded = load(home=tmp_path / "box")
    assert loaded.label == "box" and loaded.source == str(tmp_path / "box" / "config.toml")


def test_providers_and_custom_commands(tmp_path: Path) -> None:
    config = load(
        write(
            tmp_path,
            """
label = "box"
listen = false
approved_commands = ["mine"]
[providers.codex]
model = "gpt-5.5"
env = { OPENAI_API_KEY = "sk-secret" }
[providers.fast]
kind = "claude"
model = "claude-haiku-5"
[providers.mine]
command = "my-coder --task-file {SPEC} --workdir {WORKTREE}"
""",
        )
    )
    assert config.label == "box" and config.listen is False
    assert config.provider_kind("codex") == "codex"
    assert config.provider_kind("fast") == "claude"
    assert config.provider_kind("mine") == "command"
    shown = config.shown()
    assert shown["providers"]["codex"]["env"] == {"OPENAI_API_KEY": HIDDEN}
    assert "sk-secret" not in str(shown)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lable = 'x'", "lable"),
        ("[providers.codex]\nbinay = 'x'", "binay"),
        ("[providers.mine]\nmodel = 'x'", "needs `command`"),
        ("[providers.codex]\ncommand = 'x'", "only for kind"),
        ("[providers.script]\nmodel = 'x'", "built in"),
        ("listen = [", "not valid TOML"),
    ],
)
def test_mistakes_are_refused_with_the_file_and_key(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigInvalid, match=message) as info:
        load(path)
    assert str(path) in info.value.message


def test_the_example_config_file_is_valid() -> None:
    example = Path(__file__).resolve().parents[2] / "examples" / "config.toml"
    config = load(example, required=True)
    assert config.provider_kind("my-coder") == "command"
    assert config.provider_kind("fast") == "claude"
