"""Writing a synthetic model: values from each tensor's kind (zero-mean, so routing is not degenerate), streamed
one tensor at a time (a 17 GB model never sits in RAM), F32/F16 or Q4_K blocks written directly, or quantized
through the engine (Q8_0, Q4_K_M)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import EngineError
from .archs import tensor_plan, write_metadata
from .spec import SynthSpec, TensorPlan
from .tokenizer import build_tokenizer

QK_K = 256
Q4_K_BLOCK_BYTES = 144


# ---------------------------------------------------------------------------------------------------------------
# value generation


def _rng(spec: SynthSpec, name: str) -> np.random.Generator:
    h = hashlib.sha256(f"{spec.seed}:{name}".encode()).digest()
    return np.random.default_rng(int.from_bytes(h[:8], "little"))


def tensor_values(spec: SynthSpec, tp: TensorPlan) -> np.ndarray:
    """float32 values in numpy order (reverse of ne)."""
    shape = tuple(reversed(tp.ne))
    if tp.kind == "norm":
        return np.ones(shape, np.float32)
    if tp.kind == "zero":
        return np.zeros(shape, np.float32)
    if tp.kind == "fill":
        return np.full(shape, tp.std, np.float32)
    if tp.kind == "decay":        # delta-net A = -exp(A_log): negative, around -1
        return -np.exp(_rng(spec, tp.name).normal(0.0, 0.5, shape)).astype(np.float32)
    return (_rng(spec, tp.name).standard_normal(shape, dtype=np.float32) * np.float32(tp.std))


def q4_k_random_blocks(rng: np.random.Generator, n_blocks: int, std: float) -> np.ndarray:
    """Random zero-mean Q4_K blocks as uint8 [n_blocks, 144].

    Per sub-block scale sc in {2,4,6,8} and min m = 7.5*sc with dmin = d, so every value is d*sc*(q - 7.5):
    symmetric around 0 for uniform 4-bit q. E[sc^2] = 30, Var(q - 7.5) = 255/12, so d = std / sqrt(30*255/12).
    """
    out = np.empty((n_blocks, Q4_K_BLOCK_BYTES), np.uint8)
    d0 = std / np.sqrt(30 * 255 / 12)
    d = (d0 * rng.uniform(0.8, 1.2, n_blocks)).astype(np.float16)
    out[:, 0:2] = d.view(np.uint8).reshape(n_blocks, 2)
    out[:, 2:4] = out[:, 0:2]                        # dmin = d
    sc = (rng.integers(1, 5, (n_blocks, 8), dtype=np.uint8) * 2)     # 2,4,6,8
    m = (sc.astype(np.uint16) * 15 // 2).astype(np.uint8)            # 7.5*sc: 15,30,45,60
    scales = np.empty((n_blocks, 12), np.uint8)
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    out[:, 4:16] = scales
    out[:, 16:] = np.frombuffer(rng.bytes(n_blocks * 128), np.uint8).reshape(n_blocks, 128)
    return out


# ---------------------------------------------------------------------------------------------------------------
# writer


@dataclasses.dataclass(frozen=True)
class SynthInfo:
    path: Path
    file_bytes: int
    n_params: int
    seconds: float


def _encoding(spec: SynthSpec, tp: TensorPlan, direct_q4k: bool) -> str:
    if tp.kind in ("norm", "zero", "router", "bias", "decay", "conv", "fill") or len(tp.ne) == 1:
        return "f32"
    if direct_q4k and tp.ne[0] % QK_K == 0:
        return "q4_k"
    return spec.dtype


def write_model(spec: SynthSpec, out: Path, *, quant: str = "none", name: str | None = None,
                progress: Callable[[int, int], None] | None = None,
                log: Callable[[str], None] | None = None, threads: int | None = None) -> SynthInfo:
    """Write spec to out (atomically). quant: none | q4_k (direct blocks) | q8_0 | q4_k_m (through the engine)."""
    if quant not in ("none", "q4_k", "q8_0", "q4_k_m"):
        raise ValueError(f"unknown quant {quant!r}")
    t0 = time.perf_counter()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    name = name or out.stem
    if quant in ("q8_0", "q4_k_m"):
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            src = Path(tmp) / "src.gguf"
            _stream_write(spec, src, direct_q4k=False, name=name, progress=progress)
            if log:
                log(f"quantizing to {quant.upper()} through the engine")
            quantize(src, out, quant, threads=threads)
    else:
        _stream_write(spec, out, direct_q4k=quant == "q4_k", name=name, progress=progress)
    n_params = sum(tp.n for tp in tensor_plan(spec))
    return SynthInfo(out, out.stat().st_size, n_params, time.perf_counter() - t0)


def _stream_write(spec: SynthSpec, out: Path, *, direct_q4k: bool, name: str,
                  progress: Callable[[int, int], None] | None) -> None:
    import gguf

    plan = tensor_plan(spec)
    tok = build_tokenizer(spec.n_vocab)
    tmp = out.with_name(out.name + ".part")
    w = gguf.GGUFWriter(str(tmp), spec.arch)
    write_metadata(w, spec, tok, name)
    encs = []
    total = 0
    for tp in plan:
        enc = _encoding(spec, tp, direct_q4k)
        encs.append(enc)
        shape = tuple(reversed(tp.ne))
        if enc == "q4_k":
            nbytes = tp.n // QK_K * Q4_K_BLOCK_BYTES
            byte_shape = shape[:-1] + (tp.ne[0] // QK_K * Q4_K_BLOCK_BYTES,)
            w.add_tensor_info(tp.name, byte_shape, np.dtype(np.uint8), nbytes, raw_dtype=gguf.GGMLQuantizationType.Q4_K)
        else:
            dt = np.dtype(np.float16 if enc == "f16" else np.float32)
            nbytes = tp.n * dt.itemsize
            w.add_tensor_info(tp.name, shape, dt, nbytes)
        total += nbytes
    if direct_q4k:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    else:
        w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    try:
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        done = 0
        for tp, enc in zip(plan, encs):
            if enc == "q4_k":
                blocks = q4_k_random_blocks(_rng(spec, tp.name), tp.n // QK_K, tp.std)
                data = blocks.reshape(tuple(reversed(tp.ne[1:])) + (tp.ne[0] // QK_K * Q4_K_BLOCK_BYTES,))
            else:
                data = tensor_values(spec, tp)
                if enc == "f16":
                    data = data.astype(np.float16)
            w.write_tensor_data(data)
            done += data.nbytes
            del data
            if progress:
                progress(done, total)
        w.close()
        os.replace(tmp, out)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise


LLAMA_FTYPE = {"q8_0": 7, "q4_k_m": 15}


def quantize(src: Path, dst: Path, quant: str, threads: int | None = None) -> None:
    from ..native import lib as native

    L = native.llama()
    params = L.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPE[quant]
    params.nthread = threads or (os.cpu_count() or 1)
    tmp = dst.with_name(dst.name + ".part")
    rc = L.llama_model_quantize(str(src).encode(), str(tmp).encode(), params)
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise EngineError(f"quantizing to {quant} failed (code {rc}): {native.recent_log(5).strip()}")
    os.replace(tmp, dst)
