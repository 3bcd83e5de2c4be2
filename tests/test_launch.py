"""What `moeslots chat`, `moeslots` alone and the picker open: flags over [app] config (mmap, auto profile, profile,
slots), the remembered last model and its fallback."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from moeslots import cli
from moeslots.cli import chat, launch
from moeslots.tui import config


@pytest.fixture()
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path


def _cfg(dirs: Path, text: str) -> Path:
    p = dirs / "cfg" / "moeslots" / "config.toml"
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def test_app_mmap_false_is_accepted_and_typed(dirs: Path) -> None:
    """Issue 21: `[app] mmap = false` (documented, read by the CLI) was refused by the key check."""
    p = _cfg(dirs, '[app]\nmmap = false\nauto_profile = false\nmodel_dirs = ["~/models"]\nlast_model = "/m.gguf"\n')
    assert config.load(p)["app"] == {"mmap": False, "auto_profile": False, "model_dirs": ["~/models"],
                                     "last_model": "/m.gguf"}
    for bad in ('mmap = "no"', "model_dirs = [1]", 'model_dirs = "x"', "auto_profile = 1"):
        _cfg(dirs, f"[app]\n{bad}\n")
        with pytest.raises(config.ConfigError, match="wrong type"):
            config.load(p)


def test_mmap_flags_override_the_config_and_default_to_auto(dirs: Path) -> None:
    """Through config.toml as `moeslots chat` reads it (the key check let `[app] mmap` through only after this test
    read a file: it had passed a dict)."""
    p = cli.build_parser()
    m = Path("m.gguf")

    def mmap(*flags: str) -> bool | str:
        return chat.settings(m, p.parse_args(["chat", "m.gguf", *flags])).mmap

    assert p.parse_args(["chat", "m.gguf", "--no-mmap"]).mmap is False
    assert p.parse_args(["chat", "m.gguf", "--mmap"]).mmap is True
    assert mmap() == "auto"                                             # no config file
    _cfg(dirs, "[app]\nmmap = false\n")
    assert mmap() is False and mmap("--mmap") is True
    _cfg(dirs, "[app]\nmmap = true\n")
    assert mmap() is True and mmap("--no-mmap") is False
    _cfg(dirs, "[app]\nauto_profile = false\n")
    assert mmap() == "auto"


def test_auto_profile_and_the_config_profile() -> None:
    p = cli.build_parser()
    m = Path("/models/a.gguf")
    app = {"model": "/models/a.gguf", "profile": "/p/a.csv", "slots": 32}
    s = launch.resolve(m, p.parse_args(["chat", str(m)]), app)
    assert s.profile == Path("/p/a.csv") and s.slots == "32" and s.auto_profile
    other = launch.resolve(Path("/models/b.gguf"), p.parse_args(["chat", "/models/b.gguf"]), app)
    assert other.profile is None and other.slots is None                     # the config's belong to its model
    assert not launch.resolve(m, p.parse_args(["chat", str(m), "--no-auto-profile"]), {}).auto_profile
    assert not launch.resolve(m, p.parse_args(["chat", str(m)]), {"auto_profile": False}).auto_profile
    a = p.parse_args(["chat", str(m), "--profile", "/x.csv", "--slots", "8", "--repick", "16"])
    picked = launch.resolve(Path("/models/b.gguf"), a, {}, explicit=False)    # the picker: flags not carried over
    assert (picked.profile, picked.slots, picked.repick) == (None, None, None)


def test_start_model_order_and_fallback(tmp_path: Path) -> None:
    m = tmp_path / "last.gguf"
    m.write_bytes(b"GGUF")
    assert launch.start_model({}) == (None, "")
    assert launch.start_model({"last_model": str(m)}) == (m, "")
    assert launch.start_model({"model": "/pinned.gguf", "last_model": str(m)}) == (Path("/pinned.gguf"), "")
    gone, notice = launch.start_model({"last_model": str(tmp_path / "gone.gguf")})
    assert gone is None and "gone.gguf" in notice and "bundled model" in notice


def test_remember_writes_last_model_and_keeps_the_rest(dirs: Path) -> None:
    p = _cfg(dirs, '[app]\nslots = 8\n[keymap]\nrecord = "ctrl+g"\n')
    assert launch.remember(Path("rel/model.gguf")) is None
    cfg = config.load(p)
    assert cfg["app"]["last_model"] == str(Path("rel/model.gguf").absolute()) and cfg["app"]["slots"] == 8
    assert cfg["keymap"] == {"record": "ctrl+g"}


def _capture_app(monkeypatch: pytest.MonkeyPatch) -> list:
    seen: list = []

    def fake_run_app(eng, name, remember=True, a=None, model=None):
        seen.append((eng, name, model, list(eng.notices), eng._auto is not None, eng.cfg))
        eng.close()
        return 0

    monkeypatch.setattr(chat, "run_app", fake_run_app)
    return seen


def test_chat_without_a_profile_turns_the_auto_profile_on(dirs: Path, tiny_glm: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _capture_app(monkeypatch)
    assert cli.main(["chat", str(tiny_glm), "--threads", "2", "--no-mtp"]) == 0
    eng, name, model, notices, auto, cfg = seen[-1]
    assert auto and any(n.startswith("no profile for ") for n in notices)
    assert any(n.startswith("experts read into pinned") or n.startswith("experts mapped") for n in notices)
    assert config.load()["app"]["last_model"] == str(tiny_glm.absolute())      # remembered
    assert cli.main(["chat", str(tiny_glm), "--threads", "2", "--no-mtp", "--no-auto-profile", "--mmap"]) == 0
    assert not seen[-1][4] and seen[-1][5].mmap is True
    prof = dirs / "p.csv"
    from moeslots.engine.runtime.engine import Engine, EngineConfig, Message

    e = Engine(EngineConfig(model=tiny_glm, threads=2, pack_host=True, mtp=False, max_tokens=16))
    e.start_recording()
    list(e.chat([Message("user", "hi")]))
    e.stop_recording(prof)
    e.close()
    assert cli.main(["chat", str(tiny_glm), "--threads", "2", "--no-mtp", "--profile", str(prof)]) == 0
    assert not seen[-1][4] and seen[-1][5].profile == prof                    # --profile wins


def test_app_alone_reopens_the_last_model_or_says_it_is_gone(dirs: Path, tiny_glm: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _capture_app(monkeypatch)
    copy = dirs / "last.gguf"
    shutil.copyfile(tiny_glm, copy)
    _cfg(dirs, f'[app]\nlast_model = "{copy}"\n')
    assert cli.main([]) == 0
    assert seen[-1][2] == copy
    copy.unlink()
    assert cli.main([]) == 0
    eng, name, model, notices, *_ = seen[-1]
    assert name == "moeslots-tiny-glm4moe.gguf" and any("last.gguf, is gone" in n for n in notices)


def test_the_bundled_model_keeps_its_profile_and_slots_however_it_is_opened(dirs: Path, tiny_glm: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`make run` (`moeslots app --bundled`) opens the bundled model even after another model was used, and the
    bundled model opened by its path gets its own profile and 16 slots, not "no profile" and 0 slots."""
    from moeslots.engine.machine import bundled

    seen = _capture_app(monkeypatch)
    _cfg(dirs, f'[app]\nlast_model = "{tiny_glm}"\n')
    assert cli.main(["app", "--bundled"]) == 0
    assert seen[-1][2] == bundled.model()
    assert "run: engine\n\t$(PY) -m moeslots app --bundled" in (Path(__file__).parents[1] / "Makefile").read_text()
    a = chat.chat_args(bundled.model())
    s = launch.resolve(bundled.model(), a, {})
    assert s.profile == bundled.profile("merged") and s.slots == str(bundled.SLOTS)
    assert cli.main(["chat", str(bundled.model()), "--threads", "2"]) == 0
    cfg = seen[-1][5]
    assert cfg.profile == bundled.profile("merged") and not any(n.startswith("no profile") for n in seen[-1][3])
    assert cfg.slots == bundled.SLOTS
