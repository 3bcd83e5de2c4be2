"""What a GGUF's header says, read before the engine touches the file: a readable MoE model (else one clear
ModelError), its architecture, layers, experts and the bytes of one expert."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from ..errors import ModelError

GGUF_MAGIC = b"GGUF"
_EXPERT_BIAS = re.compile(r"^blk\.\d+\.ffn_(gate|up|down|gate_up)_exps\.bias$")


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the GGUF header says, read before the engine touches the file."""
    path: Path
    arch: str
    n_layer: int           # trunk layers (block_count minus NextN blocks)
    n_nextn: int
    n_expert: int
    n_expert_used: int
    n_dense_lead: int
    name: str
    slab_bytes: int = 0    # bytes of one expert (gate + up + down, or gate_up + down) in the first MoE layer
    nextn_tensors: bool = True   # the declared NextN block's tensors are in the file (some GGUFs drop them)

    @property
    def moe_layers(self) -> list[int]:
        return [i for i in range(self.n_layer + self.n_nextn) if i >= self.n_dense_lead]


def inspect_gguf(path: Path) -> ModelFacts:
    """Check that path is a readable MoE GGUF; raise ModelError with a one-line reason otherwise."""
    path = Path(path)
    if not path.exists():
        raise ModelError(f"model file not found: {path}")
    if not path.is_file():
        raise ModelError(f"not a file: {path}")
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise ModelError(f"cannot read {path}: {e.strerror}") from e
    if not magic:                       # (a download that never started, a copy that failed): no bytes to show
        raise ModelError(f"{path} is empty (0 bytes): not a GGUF model file; download or copy it again")
    if len(magic) < len(GGUF_MAGIC):
        raise ModelError(f"{path} is only {len(magic)} bytes long: not a GGUF model file")
    if magic != GGUF_MAGIC:
        raise ModelError(f"{path} is not a GGUF model file (it starts with {magic!r}, not b'GGUF')")
    try:
        from . import ggufhead

        h = ggufhead.read_header(path)      # header only: GGUFReader parses a 150k-token vocabulary for seconds
        get = h.get

        arch = str(get("general.architecture", ""))
        n_block = int(get(f"{arch}.block_count", 0))
        n_expert = int(get(f"{arch}.expert_count", 0) or 0)
        n_used = int(get(f"{arch}.expert_used_count", 0) or 0)
        n_nextn = int(get(f"{arch}.nextn_predict_layers", 0) or 0)
        n_dense = int(get(f"{arch}.leading_dense_block_count", 0) or 0)
        name = "".join(c if c.isprintable() else "\ufffd" for c in str(get("general.name", path.stem)))
        first = n_dense
        slab = 0
        names = {t.name for t in h.tensors}
        for t in h.tensors:
            if t.name.startswith(f"blk.{first}.ffn_") and "_exps." in t.name and n_expert > 0:
                slab += int(t.nbytes) // n_expert
        biased = sorted(n for n in names if _EXPERT_BIAS.match(n))
        nextn_tensors = n_nextn == 0 or f"blk.{n_block - n_nextn}.nextn.eh_proj.weight" in names
    except Exception as e:  # any parse failure of a damaged file is the same user error
        raise ModelError(f"{path} is not a valid GGUF file ({type(e).__name__}: {e})") from e
    if not arch:
        raise ModelError(f"{path} has no general.architecture: not a model GGUF")
    if not arch.isprintable():
        raise ModelError(f"{path} has an unreadable general.architecture {arch!r}: a damaged header")
    if n_expert <= 0 or n_used <= 0:
        raise ModelError(f"{path} is a dense model (arch {arch}, no experts): moeslots needs a "
                         "Mixture-of-Experts GGUF")
    if biased:
        raise ModelError(f"{path} has experts with biases ({biased[0]}, gpt-oss style): the expert cache cannot "
                         "split such experts between GPU and CPU yet")
    from . import validate

    bad = validate.first_problem(h)          # values llama.cpp would abort on, MoE shapes the engine assumes
    if bad:
        raise ModelError(f"{path} has an inconsistent header: {bad}")
    return ModelFacts(path, arch, n_block - n_nextn, n_nextn, n_expert, n_used, n_dense, name, slab, nextn_tensors)
