"""engine.hardware with fake probes: which engine `moeslots engine build` builds (and its cache key), the doctor's
CPU-engine warning, and how a model's experts are loaded (pinned or mmap) from the free RAM."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pytest

from moeslots.engine.build import wheel as build
from moeslots.engine.machine import hardware
from moeslots.engine.machine.hardware import GiB, Gpu, Toolkit

H200 = Gpu("NVIDIA H200", "9.0", 143771, 142000)
SMI_H200 = "NVIDIA H200, 9.0, 143771, 142000\n"
NVCC_OUT = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\n"


def _runner(outputs: dict[str, str | None]):
    def run(cmd: Sequence[str]) -> str | None:
        return outputs.get(Path(cmd[0]).name)
    return run


def _which(present: set[str]):
    return lambda name: f"/usr/bin/{name}" if name in present else None


# -- probes ---------------------------------------------------------------------------------------------------------


def test_nvidia_smi_is_parsed_and_its_absence_is_no_gpu() -> None:
    gpus = hardware.probe_gpus(_runner({"nvidia-smi": SMI_H200 + "NVIDIA L4, 8.9, 23034, 22000\n"}),
                               _which({"nvidia-smi"}))
    assert gpus == [H200, Gpu("NVIDIA L4", "8.9", 23034, 22000)] and gpus[0].arch == "90" and gpus[1].arch == "89"
    assert hardware.probe_gpus(_runner({}), _which(set())) == []                      # no nvidia-smi
    assert hardware.probe_gpus(_runner({"nvidia-smi": None}), _which({"nvidia-smi"})) == []   # driver fails
    bad = "No devices were found\nNVIDIA X, [N/A], 10, 5\ngarbage\n"
    assert hardware.probe_gpus(_runner({"nvidia-smi": bad}), _which({"nvidia-smi"})) == [Gpu("NVIDIA X", "", 10, 5)]
    assert Gpu("NVIDIA X", "", 10, 5).arch is None


def test_nvcc_on_path_or_in_usr_local_cuda(tmp_path: Path) -> None:
    assert hardware.probe_nvcc(_runner({"nvcc": NVCC_OUT}), _which({"nvcc"}), tmp_path / "none") == \
        Toolkit("/usr/bin/nvcc", "13.0")
    fallback = tmp_path / "cuda" / "bin" / "nvcc"
    fallback.parent.mkdir(parents=True)
    fallback.write_text("#!/bin/sh\n")
    assert hardware.probe_nvcc(_runner({"nvcc": NVCC_OUT}), _which(set()), fallback) == Toolkit(str(fallback), "13.0")
    assert hardware.probe_nvcc(_runner({}), _which(set()), tmp_path / "none") is None
    assert hardware.probe_nvcc(_runner({"nvcc": None}), _which({"nvcc"}), tmp_path / "none") is None   # fails to run


# -- which engine ---------------------------------------------------------------------------------------------------


def test_auto_builds_cuda_only_with_a_gpu_and_nvcc() -> None:
    nvcc = Toolkit("/usr/local/cuda/bin/nvcc", "13.0")
    b = hardware.choose_backend("auto", [H200], nvcc)
    assert (b.cuda, b.arch) == (True, "90")
    assert b.reason == "building the CUDA engine: NVIDIA H200 (sm_90) and nvcc 13.0 found"
    b = hardware.choose_backend("auto", [], nvcc)
    assert not b.cuda and b.reason.startswith("building the CPU engine: no NVIDIA GPU found")
    b = hardware.choose_backend("auto", [H200], None)
    assert not b.cuda and "NVIDIA H200 found but no CUDA toolkit" in b.reason and "make engine" in b.reason
    b = hardware.choose_backend("auto", [], None)
    assert b == hardware.Backend(False, None, "building the CPU engine: no NVIDIA GPU found")


def test_cpu_and_cuda_force_a_backend() -> None:
    nvcc = Toolkit("/usr/bin/nvcc", "12.4")
    assert not hardware.choose_backend("cpu", [H200], nvcc).cuda
    assert "--cpu given" in hardware.choose_backend("cpu", [H200], nvcc).reason
    forced = hardware.choose_backend("cuda", [], nvcc)
    assert (forced.cuda, forced.arch) == (True, "90") and "--cuda given" in forced.reason
    assert hardware.choose_backend("cuda", [Gpu("L4", "8.9", 1, 1)], nvcc).arch == "89"
    assert hardware.choose_backend("auto", [H200], nvcc, arch="100").arch == "100"     # --cuda-arch wins
    with pytest.raises(ValueError, match="auto, cpu or cuda"):
        hardware.choose_backend("metal", [], None)


def test_the_cache_key_carries_the_chosen_backend() -> None:
    """A CPU wheel is never taken for a CUDA request: auto on a GPU machine keys like --cuda, not like the CPU."""
    probe_gpu = lambda: ([H200], Toolkit("/usr/bin/nvcc", "13.0"))  # noqa: E731
    probe_cpu = lambda: ([], None)  # noqa: E731
    auto_gpu, why = build.choose_flags("auto", probe=probe_gpu)
    auto_cpu, _ = build.choose_flags("auto", probe=probe_cpu)
    assert auto_gpu.cuda and auto_gpu.cuda_arch == "90" and "CUDA engine" in why
    key = lambda f: build.build_key("sdist", "pid", f)  # noqa: E731
    assert key(auto_gpu) == key(build.BuildFlags(cuda=True, cuda_arch="90"))
    assert key(auto_cpu) == key(build.BuildFlags())            # CPU keys unchanged: cached CPU wheels stay valid
    assert key(auto_gpu) != key(auto_cpu)
    assert key(build.BuildFlags(cuda=True, cuda_arch="89")) != key(auto_gpu)


def test_a_cached_cpu_wheel_is_not_installed_for_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache"
    pid = build.patches_hash(build.patch_files())
    cpu_key = build.build_key(build.SDIST_SHA256, pid, build.BuildFlags())
    wheel = cache / "wheels" / cpu_key / "llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"cpu")
    installed: list[Path] = []
    built: list[build.BuildFlags] = []
    monkeypatch.setattr(build, "install_wheel", lambda w, k: installed.append(w))
    monkeypatch.setattr(build, "installed_key", lambda: cpu_key)
    monkeypatch.setattr(build, "prepare_source", lambda dest, *a, **k: dest)
    monkeypatch.setattr(build, "sync_tree", lambda s, t: 0)

    def fake_build(tree: Path, flags: build.BuildFlags, *a: object, **k: object) -> Path:
        built.append(flags)
        out = cache / "cuda.whl"
        out.write_bytes(b"cuda")
        return out

    monkeypatch.setattr(build, "build_wheel", fake_build)
    flags, _ = build.choose_flags("auto", probe=lambda: ([H200], Toolkit("/usr/bin/nvcc", "13.0")))
    res = build.ensure_engine(flags, cache=cache, log=lambda m: None)
    assert res.action == "built" and built[0].cuda and installed == [cache / "cuda.whl"]


def test_engine_build_defaults_to_auto_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    from moeslots import cli

    seen: list[build.BuildFlags] = []

    def fake_ensure(flags: build.BuildFlags, **k: object) -> build.BuildResult:
        seen.append(flags)
        return build.BuildResult("k", Path("w.whl"), "up-to-date", 0.0)

    monkeypatch.setattr(build, "ensure_engine", fake_ensure)
    monkeypatch.setattr(hardware, "probe_gpus", lambda: [H200])
    monkeypatch.setattr(hardware, "probe_nvcc", lambda: Toolkit("/usr/bin/nvcc", "13.0"))
    assert cli.main(["engine", "build"]) == 0
    assert seen[-1].cuda and seen[-1].cuda_arch == "90"
    assert "building the CUDA engine: NVIDIA H200 (sm_90) and nvcc 13.0 found" in capsys.readouterr().err
    assert cli.main(["engine", "build", "--cpu"]) == 0 and not seen[-1].cuda
    assert "building the CPU engine: --cpu given" in capsys.readouterr().err
    monkeypatch.setattr(hardware, "probe_gpus", lambda: [])
    assert cli.main(["engine", "build"]) == 0 and not seen[-1].cuda
    assert "building the CPU engine: no NVIDIA GPU found" in capsys.readouterr().err
    assert cli.main(["engine", "build", "--cuda"]) == 0 and seen[-1].cuda


def test_doctor_warns_when_a_gpu_meets_a_cpu_engine() -> None:
    w = hardware.cpu_engine_warning([H200], engine_has_gpu=False)
    assert w is not None and "NVIDIA H200" in w and "CPU-only" in w and "make engine" in w
    assert hardware.cpu_engine_warning([H200], engine_has_gpu=True) is None
    assert hardware.cpu_engine_warning([], engine_has_gpu=False) is None


def test_doctor_prints_the_warning(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from moeslots import cli

    monkeypatch.setattr(hardware, "probe_gpus", lambda: [H200])     # the CPU engine of CI sees no GPU backend
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert "warning" in out and "NVIDIA H200 is present but the installed engine is CPU-only" in out


# -- load mode ------------------------------------------------------------------------------------------------------


def test_meminfo_is_read() -> None:
    text = "MemTotal:       131072000 kB\nMemFree:  1000 kB\nMemAvailable:   120000000 kB\n"
    assert hardware.mem_available(text) == 120000000 * 1024
    assert hardware.mem_available("MemTotal: 5 kB\n") is None
    assert isinstance(hardware.mem_available(), int)                 # this machine's /proc/meminfo


def test_pinned_when_ram_holds_the_experts_with_a_margin() -> None:
    experts = 18 * GiB
    need = int(experts * 1.1) + 4 * GiB
    pinned = hardware.choose_load_mode(experts, need + 1)
    assert pinned.mmap is False and "pinned host memory" in pinned.line
    mapped = hardware.choose_load_mode(experts, need - GiB // 2)
    assert mapped.mmap is True and "mmap" in mapped.line and "--no-mmap" in mapped.line
    assert hardware.choose_load_mode(experts, None).mmap is True          # unknown RAM: the safe choice
    assert hardware.choose_load_mode(experts, 10**15, override=True).mmap is True      # --mmap wins
    assert hardware.choose_load_mode(experts, 0, override=False).mmap is False         # --no-mmap wins
    assert hardware.resolve_mmap("auto", experts, lambda: need + 1).mmap is False
    assert hardware.resolve_mmap("auto", experts, lambda: 8 * GiB).mmap is True
    assert hardware.resolve_mmap(True, experts, lambda: 10**15).mmap is True
    with pytest.raises(ValueError):
        hardware.resolve_mmap("maybe", experts)


def test_the_engine_loads_as_the_free_ram_says(tiny_glm: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moeslots.engine.runtime.engine import Engine, EngineConfig

    for ram, mmap in ((64 * GiB, False), (2 * GiB, True)):
        monkeypatch.setattr(hardware, "mem_available", lambda: ram)
        e = Engine(EngineConfig(model=tiny_glm, n_ctx=256, threads=2, pack_host=True, mtp=False))
        try:
            assert e.model.opts.use_mmap is mmap
            assert any(n.startswith("experts " + ("mapped" if mmap else "read into pinned")) for n in e.notices)
        finally:
            e.close()
