from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from moeslots.engine import synth

# The tests never read or write the developer's own config.toml, calibration, chat history or saved profiles: the
# XDG config and data homes are empty folders of this run (set here, before any test, so the app and CLI
# subprocesses the tests start inherit them too). A test that needs a config writes one there or in its own
# tmp_path (monkeypatch.setenv). The engine's build cache (XDG_CACHE_HOME) stays shared: `make test` built it.
_HOMES = Path(tempfile.mkdtemp(prefix="moeslots-tests-"))
os.environ["XDG_CONFIG_HOME"] = str(_HOMES / "config")
os.environ["XDG_DATA_HOME"] = str(_HOMES / "data")
atexit.register(shutil.rmtree, _HOMES, ignore_errors=True)

from specs import TINY_DS2, TINY_GLM, TINY_Q35, TINY_QWEN  # noqa: E402  (tests/ is on sys.path: rootdir conftest)


@pytest.fixture(scope="session")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_glm(models_dir: Path) -> Path:
    return synth.write_model(TINY_GLM, models_dir / "tiny-glm4moe.gguf").path


@pytest.fixture(scope="session")
def tiny_qwen(models_dir: Path) -> Path:
    return synth.write_model(TINY_QWEN, models_dir / "tiny-qwen3moe.gguf").path


@pytest.fixture(scope="session")
def tiny_ds2(models_dir: Path) -> Path:
    return synth.write_model(TINY_DS2, models_dir / "tiny-deepseek2.gguf").path


@pytest.fixture(scope="session")
def tiny_q35(models_dir: Path) -> Path:
    return synth.write_model(TINY_Q35, models_dir / "tiny-qwen35moe.gguf").path


@pytest.fixture(scope="session")
def dense_gguf(models_dir: Path) -> Path:
    """A GGUF header of a dense (non-MoE) model: rejected before the engine loads anything."""
    import gguf

    p = models_dir / "dense-llama.gguf"
    w = gguf.GGUFWriter(str(p), "llama")
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return p


@pytest.fixture()
def decode_threads(monkeypatch: pytest.MonkeyPatch) -> list:
    """The thread of every Context.decode from here on, in call order (which thread computes: a thread that outlives
    its work keeps its CPU thread team parked, engine.runtime.passing_thread)."""
    import threading

    from moeslots.engine.llm.model import Context

    seen: list[threading.Thread] = []
    real = Context.decode

    def decode(self: Context, *a: object, **k: object) -> object:
        seen.append(threading.current_thread())
        return real(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(Context, "decode", decode)
    return seen
