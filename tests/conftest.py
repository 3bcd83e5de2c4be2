from __future__ import annotations

import os
from pathlib import Path

import pytest

from moeslots.engine import synth

# keep user dirs out of the tests
os.environ.setdefault("MOESLOTS_TEST", "1")

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
