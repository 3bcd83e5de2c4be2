"""`moeslots models` discovery on fake Hugging Face / LM Studio / config / current-folder layouts of synthetic GGUFs:
snapshot symlinks followed and deduplicated, split models counted once, headers read fast and right, fit verdicts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from ggufs import write_moe  # (tests/ is on sys.path)

from moeslots.engine.llm import ggufhead
from moeslots.engine.llm.facts import inspect_gguf
from moeslots.engine.machine import discovery
from moeslots.engine.machine.hardware import GiB, Gpu

EXPERT_BYTES_PER_LAYER = 3 * 8 * 4 * 4 * 4       # up, gate, down: 8 experts of 4x4 f32


@pytest.fixture()
def layout(tmp_path: Path, tiny_glm: Path) -> dict:
    home = tmp_path / "home"
    hub = tmp_path / "hf" / "hub"
    repo = hub / "models--acme--Tiny-MoE-GGUF"
    blob = write_moe(repo / "blobs" / "0f1e2d3c", vocab=2000)
    for rev in ("rev1", "rev2"):                          # two snapshots of one blob: one model
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        (snap / "tiny-moe-Q4.gguf").symlink_to(os.path.relpath(blob, snap))
    (repo / "snapshots" / "rev1" / "broken.gguf").symlink_to("../../blobs/missing")   # an interrupted download
    real = hub / "models--zai--GLM-Tiny" / "snapshots" / "abc"
    real.mkdir(parents=True)
    (real / "glm.gguf").symlink_to(tiny_glm)             # a real synthetic glm4moe, through a symlink
    lms = home / ".lmstudio" / "models" / "pub" / "split"
    write_moe(lms / "big-00001-of-00002.gguf", layers=(0,), split=(0, 2))
    write_moe(lms / "big-00002-of-00002.gguf", layers=(1,), split=(1, 2))
    write_moe(home / ".cache" / "lm-studio" / "models" / "d" / "dense.gguf", arch="llama", dense=True)
    mine = tmp_path / "mine"
    write_moe(mine / "deep" / "own.gguf", n_expert=16, k=4)
    cwd = tmp_path / "cwd"
    write_moe(cwd / "here.gguf")
    write_moe(cwd / "sub" / "nested.gguf")              # the current folder is searched at its top level only
    (cwd / "notes.gguf").write_text("notes about models, not a model\n")
    env = {"HF_HOME": str(tmp_path / "hf")}
    return {"home": home, "env": env, "cwd": cwd, "dirs": [str(mine)], "blob": blob, "tiny_glm": tiny_glm}


def _survey(layout: dict, gpus: list[Gpu], ram: int | None) -> discovery.Survey:
    return discovery.survey(layout["dirs"], env=layout["env"], home=layout["home"], cwd=layout["cwd"], gpus=gpus,
                            ram_free=ram)


def test_every_source_is_searched_once_per_real_file(layout: dict) -> None:
    s = _survey(layout, [], 64 * GiB)
    by_label = {m.found.label: m for m, _ in s.models}
    assert sorted(m.found.label for m, _ in s.models) == sorted([
        "acme/Tiny-MoE-GGUF: tiny-moe-Q4.gguf", "zai/GLM-Tiny: glm.gguf", "big-00001-of-00002.gguf", "dense.gguf",
        "own.gguf", "here.gguf", "notes.gguf", "moeslots-tiny-glm4moe.gguf (bundled)"])
    assert {m.found.source for m, _ in s.models} == {"bundled", "hf", "lmstudio", "config", "cwd"}
    assert by_label["moeslots-tiny-glm4moe.gguf (bundled)"].error == ""      # listed first, and usable
    hf = by_label["acme/Tiny-MoE-GGUF: tiny-moe-Q4.gguf"]
    assert hf.found.path.resolve() == layout["blob"].resolve() and hf.size == layout["blob"].stat().st_size


def test_headers_give_arch_experts_and_sizes(layout: dict) -> None:
    by_label = {m.found.label: m for m, _ in _survey(layout, [], 64 * GiB).models}
    hf = by_label["acme/Tiny-MoE-GGUF: tiny-moe-Q4.gguf"]
    assert (hf.arch, hf.n_expert, hf.k, hf.moe_layers, hf.error) == ("qwen3moe", 8, 2, 2, "")
    assert hf.expert_bytes == 2 * EXPERT_BYTES_PER_LAYER
    split = by_label["big-00001-of-00002.gguf"]                       # both shards: size and experts
    lms = layout["home"] / ".lmstudio" / "models" / "pub" / "split"
    assert split.size == sum(p.stat().st_size for p in lms.iterdir())
    assert split.expert_bytes == 2 * EXPERT_BYTES_PER_LAYER and split.moe_layers == 2
    assert by_label["own.gguf"].n_expert == 16 and by_label["own.gguf"].k == 4
    assert "dense model" in by_label["dense.gguf"].error
    assert "not a GGUF" in by_label["notes.gguf"].error
    glm = by_label["zai/GLM-Tiny: glm.gguf"]                          # agrees with the engine's own inspection
    facts = inspect_gguf(layout["tiny_glm"])
    assert (glm.arch, glm.n_expert, glm.k, glm.n_layer) == (facts.arch, facts.n_expert, facts.n_expert_used,
                                                              facts.n_layer)
    assert glm.slab_bytes == facts.slab_bytes


def test_fit_verdicts(layout: dict) -> None:
    by_label = {m.found.label: m for m, _ in _survey(layout, [], 64 * GiB).models}
    m = by_label["acme/Tiny-MoE-GGUF: tiny-moe-Q4.gguf"]
    big = Gpu("NVIDIA H200", "9.0", 143771, 142000)
    assert discovery.fit(m, big.free_mib << 20, 64 * GiB).kind == "gpu"
    assert discovery.fit(m, None, 64 * GiB).kind == "cpu"
    assert discovery.fit(m, None, 1000).kind == "no"                            # does not fit RAM
    assert discovery.fit(m, 1000, 64 * GiB).kind == "no"                        # non-expert weights exceed VRAM
    # a GPU that holds the rest and some experts: experts on host, N slots (N from the same rule as --slots auto)
    from moeslots.profiles.plan import auto_slots

    vram = m.gpu_bytes + discovery.VRAM_MARGIN + 2 * m.moe_layers * m.slab_bytes + 7   # 2 slots (no zero slot)
    f = discovery.fit(m, vram, 64 * GiB)
    assert (f.kind, f.slots) == ("slots", 2) == ("slots", auto_slots(vram - m.gpu_bytes, 2, m.slab_bytes, 8))
    assert "2 of 8 slots per layer" in f.line
    assert discovery.fit(by_label["dense.gguf"], None, 64 * GiB).kind == "no"


def test_a_big_vocabulary_header_is_read_fast(tmp_path: Path) -> None:
    p = write_moe(tmp_path / "vocab.gguf", vocab=150_000)
    t0 = time.perf_counter()
    h = ggufhead.read_header(p)
    dt = time.perf_counter() - t0
    assert h.meta["tokenizer.ggml.tokens#len"] == 150_000 and h.meta["qwen3moe.expert_count"] == 8
    assert dt < 2.0, f"{dt:.2f} s"                        # gguf.GGUFReader takes several seconds on this header
    with pytest.raises(ggufhead.HeaderError, match="ends early|runs past"):
        cut = tmp_path / "cut.gguf"
        cut.write_bytes(p.read_bytes()[:200_000])
        ggufhead.read_header(cut)


def test_models_command_lists_them(layout: dict, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from moeslots import cli
    from moeslots.engine.machine import hardware

    monkeypatch.setenv("HF_HOME", layout["env"]["HF_HOME"])
    monkeypatch.setenv("HOME", str(layout["home"]))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    (tmp_path / "cfg" / "moeslots").mkdir(parents=True)
    (tmp_path / "cfg" / "moeslots" / "config.toml").write_text(f'[app]\nmodel_dirs = ["{layout["dirs"][0]}"]\n')
    monkeypatch.chdir(layout["cwd"])
    monkeypatch.setattr(hardware, "probe_gpus", lambda: [])
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert "acme/Tiny-MoE-GGUF: tiny-moe-Q4.gguf" in out and "own.gguf" in out and "here.gguf" in out
    assert "nested.gguf" not in out and "no NVIDIA GPU" in out
    line = next(x for x in out.splitlines() if "own.gguf" in x)
    assert "qwen3moe" in line and "16 (k=4)" in line and "CPU only" in line
    assert cli.main(["models", str(tmp_path / "nope")]) == 2


def test_a_file_cut_short_is_listed_as_unusable(tmp_path: Path, tiny_glm: Path) -> None:
    """A GGUF whose header reads but whose tensor data is cut short (an interrupted download) is listed with the
    reason, not as fitting: the engine would refuse it."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny_glm.read_bytes()[: tiny_glm.stat().st_size - 4096])
    whole = discovery.describe(discovery.Found(tiny_glm, "cwd", tiny_glm.name))
    m = discovery.describe(discovery.Found(cut, "cwd", cut.name))
    assert whole.error == "" and m.error.startswith("cut short: cut.gguf has"), m.error
    assert discovery.fit(m, None, 64 * GiB).kind == "no"
