"""Find the GGUF models a user already has (Hugging Face hub cache, LM Studio, configured folders, the current
directory), read their headers only, and say whether each fits this machine (`moeslots models`, the app's picker).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from ...profiles.plan import auto_slots
from ..llm import ggufhead
from ..native.lib import EXPERT_TENSOR_PATTERN
from . import bundled

if TYPE_CHECKING:
    from . import hardware

GiB = 1 << 30
VRAM_MARGIN = 1 << 30           # what `--slots auto` keeps free (profiles.plan.auto_slots)
_EXPERT = re.compile(EXPERT_TENSOR_PATTERN)
_BLK = re.compile(r"^blk\.(\d+)\.")


@dataclasses.dataclass(frozen=True)
class Root:
    source: str                  # "bundled", "hf", "lmstudio", "config", "cwd"
    path: Path
    recursive: bool = True


def hf_hub_dir(env: Mapping[str, str], home: Path) -> Path:
    """The Hugging Face hub cache: $HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    return home / ".cache" / "huggingface" / "hub"


def roots(model_dirs: Sequence[str] = (), env: Mapping[str, str] | None = None, home: Path | None = None,
          cwd: Path | None = None) -> list[Root]:
    env = os.environ if env is None else env
    home = Path.home() if home is None else home
    out = [Root("bundled", bundled.model().parent, recursive=False)] if bundled.present() else []
    out += [Root("hf", hf_hub_dir(env, home)),
           Root("lmstudio", home / ".lmstudio" / "models"), Root("lmstudio", home / ".cache" / "lm-studio" / "models")]
    out += [Root("config", Path(d).expanduser()) for d in model_dirs]
    out.append(Root("cwd", Path.cwd() if cwd is None else cwd, recursive=False))
    return out


@dataclasses.dataclass(frozen=True)
class Found:
    path: Path                   # as found (an HF snapshot path is a symlink into blobs/)
    source: str
    label: str                   # "org/repo: file.gguf" for the HF cache, the file name otherwise


def _hf_label(path: Path, root: Path) -> str:
    try:
        repo_dir = path.relative_to(root).parts[0]
    except (ValueError, IndexError):
        return path.name
    if repo_dir.startswith("models--"):
        return repo_dir[len("models--"):].replace("--", "/") + ": " + path.name
    return path.name


def _walk(root: Root) -> Iterable[Path]:
    if not root.path.is_dir():
        return []
    if root.source == "hf":          # models--org--name/snapshots/<rev>/**.gguf (symlinks to ../../blobs/<sha>)
        return sorted(root.path.glob("models--*/snapshots/*/**/*.gguf"))
    return sorted(root.path.rglob("*.gguf") if root.recursive else root.path.glob("*.gguf"))


def find(search: Sequence[Root]) -> list[Found]:
    """Every GGUF under the roots, once per real file (an HF snapshot and a symlink to it are one), later shards of
    a split model left out (the first names the model)."""
    seen: set[Path] = set()
    out: list[Found] = []
    for root in search:
        try:
            paths = list(_walk(root))
        except OSError:
            continue
        for p in paths:
            m = ggufhead.SPLIT_RE.match(p.name)
            if m and int(m.group("i")) != 1:
                continue
            try:
                real = p.resolve(strict=True)
            except (OSError, RuntimeError):
                continue                                     # a dangling symlink (an interrupted download)
            if real in seen or not real.is_file():
                continue
            seen.add(real)
            label = (_hf_label(p, root.path) if root.source == "hf" else
                     f"{p.name} (bundled)" if root.source == "bundled" else p.name)
            out.append(Found(p, root.source, label))
    return out


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    found: Found
    size: int                    # bytes of every shard
    arch: str = ""
    name: str = ""
    n_expert: int = 0
    k: int = 0
    n_layer: int = 0             # trunk layers
    moe_layers: int = 0          # trunk layers with experts (the ones that get slots)
    expert_bytes: int = 0        # all expert tensors (trunk + NextN)
    slot_expert_bytes: int = 0   # expert tensors of the trunk MoE layers
    error: str = ""              # why it cannot be used ("" when it can)

    @property
    def slab_bytes(self) -> int:
        n = self.moe_layers * self.n_expert
        return self.slot_expert_bytes // n if n else 0

    @property
    def gpu_bytes(self) -> int:
        """What stays on the GPU besides the slots: everything but the trunk's experts."""
        return max(0, self.size - self.slot_expert_bytes)


def describe(f: Found) -> ModelInfo:
    """Header facts of one found file (all shards); a file moeslots cannot use says why in .error."""
    try:
        shards = ggufhead.shard_paths(f.path)
        size = sum(p.stat().st_size for p in shards)
        heads = [ggufhead.read_header(p) for p in shards]
    except (OSError, ggufhead.HeaderError) as e:
        msg = str(e).replace(str(f.path), "").lstrip(" :") if isinstance(e, ggufhead.HeaderError) else \
            f"unreadable: {e}"
        return ModelInfo(f, 0, error=msg)
    h = heads[0]
    arch = str(h.get("general.architecture", ""))
    n_expert = int(h.get(f"{arch}.expert_count", 0) or 0)
    k = int(h.get(f"{arch}.expert_used_count", 0) or 0)
    n_block = int(h.get(f"{arch}.block_count", 0) or 0)
    n_layer = n_block - int(h.get(f"{arch}.nextn_predict_layers", 0) or 0)
    expert = slot = 0
    layers: set[int] = set()
    for t in (t for hd in heads for t in hd.tensors):
        if _EXPERT.search(t.name):
            expert += t.nbytes
            m = _BLK.match(t.name)
            if m and int(m.group(1)) < n_layer:
                slot += t.nbytes
                layers.add(int(m.group(1)))
    error = ""
    short = [(p, p.stat().st_size, hd.data_end) for p, hd in zip(shards, heads) if p.stat().st_size < hd.data_end]
    if short:
        p, have, need = short[0]
        error = (f"cut short: {p.name} has {size_text(have)} of the {size_text(need)} its tensors need (an "
                 "interrupted download or copy): the engine refuses it")
    elif not arch:
        error = "no general.architecture: not a model"
    elif n_expert <= 0 or k <= 0:
        error = f"dense model ({arch}): moeslots needs a Mixture-of-Experts model"
    elif not layers:
        error = "no expert tensors found"
    else:
        from ..llm import validate

        bad = validate.first_problem(h, [t for hd in heads for t in hd.tensors])
        error = f"inconsistent header: {bad}" if bad else ""
    return ModelInfo(f, size, arch, str(h.get("general.name", f.path.stem)), n_expert, k, n_layer, len(layers),
                     expert, slot, error)


@dataclasses.dataclass(frozen=True)
class Fit:
    kind: str                    # "gpu" (all on the GPU), "slots" (experts on host, N slots), "cpu", "no"
    slots: int                   # slots per layer that fit the free VRAM ("gpu": every expert)
    line: str


def fit(m: ModelInfo, vram_free: int | None, ram_free: int | None) -> Fit:
    """Where the model would live here: vram_free is the largest GPU's free bytes (None: no GPU), ram_free
    MemAvailable (None: unknown)."""
    if m.error:
        return Fit("no", 0, m.error)
    ram_note = ""
    if ram_free is not None and m.slot_expert_bytes > ram_free:
        ram_note = (f"; its experts ({m.slot_expert_bytes / GiB:.1f} GiB) exceed the free RAM "
                    f"({ram_free / GiB:.1f} GiB): they would page from disk")
    if vram_free is None:
        if ram_free is not None and m.size > ram_free:
            return Fit("no", 0, f"does not fit RAM ({m.size / GiB:.1f} GiB > {ram_free / GiB:.1f} GiB free; no GPU)")
        return Fit("cpu", 0, "CPU only (no GPU): fits RAM" if ram_free is not None else "CPU only (no GPU)")
    if m.gpu_bytes + VRAM_MARGIN > vram_free:
        return Fit("no", 0, f"does not fit: its non-expert weights ({m.gpu_bytes / GiB:.1f} GiB) exceed the free "
                            f"VRAM ({vram_free / GiB:.1f} GiB)")
    s = auto_slots(vram_free - m.gpu_bytes, m.moe_layers, m.slab_bytes, m.n_expert)
    if s >= m.n_expert:
        return Fit("gpu", s, "all on the GPU")
    if ram_note:
        return Fit("no", s, f"does not fit RAM: {s} of {m.n_expert} slots on the GPU" + ram_note)
    return Fit("slots", s, f"experts on host, {s} of {m.n_expert} slots per layer on the GPU")


@dataclasses.dataclass(frozen=True)
class Survey:
    models: list[tuple[ModelInfo, Fit]]
    machine: str                 # one line: the GPU's free VRAM (or none) and the free RAM
    searched: list[Root]


def survey(model_dirs: Sequence[str] = (), env: Mapping[str, str] | None = None, home: Path | None = None,
           cwd: Path | None = None, gpus: "Sequence[hardware.Gpu] | None" = None,
           ram_free: int | None = -1) -> Survey:
    """The models found and where each would live on this machine. gpus / ram_free replace the probes (tests)."""
    from . import hardware

    gpus = hardware.probe_gpus() if gpus is None else gpus
    ram = hardware.mem_available() if ram_free == -1 else ram_free
    best = max(gpus, key=lambda g: g.free_mib) if gpus else None
    vram = best.free_mib << 20 if best else None
    machine = (f"{best.name}: {best.free_mib / 1024:.1f} GiB of VRAM free" if best else "no NVIDIA GPU") + \
              (f"; {ram / GiB:.1f} GiB of RAM free" if ram is not None else "")
    search = roots(model_dirs, env, home, cwd)
    found = [describe(f) for f in find(search)]
    return Survey([(m, fit(m, vram, ram)) for m in found], machine, search)


def size_text(b: int) -> str:
    return f"{b / GiB:.1f} GiB" if b >= GiB else f"{b / 2**20:.0f} MiB"


def table(s: Survey) -> list[str]:
    """`moeslots models`: one line per model, then where it looked."""
    head = ("model", "size", "arch", "experts", "fits here", "path")
    rows = [(m.found.label, size_text(m.size), m.arch or "?",
             f"{m.n_expert} (k={m.k})" if m.n_expert else "-", f.line, str(m.found.path)) for m, f in s.models]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head) - 1)]
    out = [s.machine]
    for r in [head, *rows]:
        out.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    if not rows:
        out.append("(no GGUF files found)")
    out.append("searched: " + ", ".join(f"{r.path}{'' if r.recursive else ' (top level)'}" for r in s.searched))
    return out


def expert_bytes(path: Path) -> int:
    """Bytes of a model's expert tensors, from its header (0 when it cannot be read: loading will say why)."""
    return describe(Found(Path(path), "", Path(path).name)).expert_bytes
