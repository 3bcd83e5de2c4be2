"""config.toml: read with tomllib, written atomically with tomli-w, bad files give one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest

from moeslots.tui import config


def test_round_trip_keeps_other_sections(tmp_path: Path) -> None:
    p = tmp_path / "config.toml"
    p.write_text('[keymap]\nrecord = "ctrl+g"\n')
    config.save_app({"slots": "auto", "profile": "/p.csv"}, p)
    cfg = config.load(p)
    assert cfg["keymap"] == {"record": "ctrl+g"} and cfg["app"] == {"slots": "auto", "profile": "/p.csv"}
    config.save_app({"slots": 64}, p)
    assert config.load(p)["app"]["slots"] == 64


@pytest.mark.parametrize("text,needle", [
    ("[app\n", "config.toml"),
    ("[app]\ncolour = 1\n", "unknown key app.colour"),
    ("[app]\nmtp = 3\n", "app.mtp has the wrong type"),
    ("[keymap]\nrecord = 5\n", "binding ids to key strings"),
])
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    p = tmp_path / "config.toml"
    p.write_text(text)
    with pytest.raises(config.ConfigError, match=needle):
        config.load(p)


def test_the_policy_can_be_set_in_the_config(tmp_path) -> None:  # noqa: ANN001
    """[app] policy (read by `moeslots chat` as its default) is a known key; a policy that is none is one line."""
    import pytest

    from moeslots.tui import config

    p = tmp_path / "config.toml"
    p.write_text('[app]\npolicy = "fetch"\n')
    assert config.load(p)["app"]["policy"] == "fetch"
    p.write_text('[app]\npolicy = "lru"\n')
    with pytest.raises(config.ConfigError, match="app.policy is one of static"):
        config.load(p)
