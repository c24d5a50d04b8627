"""GGUF files -> metadata and float tensors, through gguf-py's memmap reader.

Every way a file can be wrong gets its own error: bad magic, an unsupported version, a truncated
file, an unsupported architecture or tensor type, a missing tensor. Dequantization is ours
(``engine.quants``, vectorized torch, checked bit-exact against gguf-py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch

from engine.quants import SUPPORTED, UnsupportedTensorType, dequantize

SUPPORTED_ARCHITECTURES = ("qwen2", "qwen3")


class GGUFError(ValueError):
    """A GGUF file that cannot be used, with the reason."""


class BadMagic(GGUFError):
    pass


class UnsupportedVersion(GGUFError):
    pass


class TruncatedFile(GGUFError):
    pass


class UnsupportedArchitecture(GGUFError):
    pass


class MissingTensor(GGUFError):
    pass


__all__ = [
    "BadMagic",
    "GGUFError",
    "GGUFFile",
    "MissingTensor",
    "TensorInfo",
    "TruncatedFile",
    "UnsupportedArchitecture",
    "UnsupportedTensorType",
    "UnsupportedVersion",
]


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's directory entry."""

    name: str
    qtype: gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # numpy order: reversed ggml ne
    n_bytes: int
    offset: int


class _Reader(gguf.GGUFReader):
    """gguf-py's reader, with its field parsing sped up about 3x.

    The reader slices its ``np.memmap`` once per value, and ``np.memmap.__getitem__`` is a Python-level
    override; with ~300k tokenizer strings that dominated model load (about 7 s of 9). Slicing a plain
    ndarray view of the same mapping gives the same zero-copy arrays without that overhead.
    """

    def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        dt = np.dtype(dtype)
        count = int(count)
        arr = plain[offset : offset + dt.itemsize * count].view(dt)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any], list[int], list[Any]]:
        """An array of strings or scalars as one part (`CompactArray`) instead of one or two numpy views per
        element: the tokenizer's ~300k strings took 3.3 s of a 0.5B model's load that way, 0.2 s this way.
        Nested arrays and byte-swapped files take the library's path."""
        if raw_type != gguf.GGUFValueType.ARRAY or self.byte_order != "I" or self.__dict__.get("_nested"):
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        start, count = orig_offs + 12, int(alen[0])
        itype = gguf.GGUFValueType(int(raw_itype[0]))
        plain = self.__dict__.get("_plain")
        if plain is None:
            plain = self._plain = self.data.view(np.ndarray)
        if itype == gguf.GGUFValueType.STRING:
            buf = memoryview(plain.data)
            offs = start
            for _ in range(count):
                offs += 8 + int.from_bytes(buf[offs : offs + 8], "little")
            if offs > len(plain):
                raise ValueError(f"a string array at byte {orig_offs} runs past the end of the file")
            packed = CompactArray(plain[start:offs], itype, count)
        elif itype in self.gguf_scalar_to_np:
            values = self._get(start, self.gguf_scalar_to_np[itype], count)
            if len(values) != count:
                raise ValueError(f"an array at byte {orig_offs} runs past the end of the file")
            packed = CompactArray(values, itype, count)
        else:  # an array of arrays: the library's path all the way down (it flattens them)
            self._nested = True
            try:
                return super()._get_field_parts(orig_offs, raw_type)
            finally:
                self._nested = False
        size = 12 + packed.raw.nbytes
        return size, [raw_itype, alen, packed], [2], [gguf.GGUFValueType.ARRAY, itype]


@dataclass(frozen=True)
class CompactArray:
    """A GGUF array field's elements as one buffer: scalars as their numpy array, strings as the raw
    length-prefixed bytes (decoded by `values`)."""

    raw: np.ndarray
    itype: Any
    count: int

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def values(self) -> list[Any]:
        if self.itype != gguf.GGUFValueType.STRING:
            return [_scalar(v) for v in self.raw]
        buf, out, offs = self.raw.tobytes(), [], 0
        for _ in range(self.count):
            n = int.from_bytes(buf[offs : offs + 8], "little")
            out.append(buf[offs + 8 : offs + 8 + n].decode("utf-8", errors="replace"))
            offs += 8 + n
        return out


def _check_header(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
    if len(head) < 8:
        raise TruncatedFile(f"{path}: {size} bytes is too short for a GGUF header")
    magic = int.from_bytes(head[:4], "little")
    if magic != gguf.GGUF_MAGIC:
        raise BadMagic(f"{path}: not a GGUF file (magic {head[:4]!r}, expected b'GGUF')")
    version = int.from_bytes(head[4:8], "little")
    if version not in (2, 3):
        raise UnsupportedVersion(f"{path}: GGUF version {version} is not supported (2 or 3)")


class GGUFFile:
    """A validated, memory-mapped GGUF file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise GGUFError(f"{self.path}: no such file")
        _check_header(self.path)
        try:
            self._reader = _Reader(self.path, "r")
        except (ValueError, IndexError, OverflowError, MemoryError) as exc:
            # gguf-py reads the directory with raw memmap offsets: a cut-off file shows up here.
            raise TruncatedFile(
                f"{self.path}: cannot read the GGUF directory ({exc}); the file is truncated or corrupt"
            ) from exc
        size = self.path.stat().st_size
        self.tensors: dict[str, TensorInfo] = {}
        for t in self._reader.tensors:
            info = TensorInfo(
                name=t.name,
                qtype=gguf.GGMLQuantizationType(t.tensor_type),
                shape=tuple(int(d) for d in reversed(t.shape.tolist())),
                n_bytes=int(t.n_bytes),
                offset=int(t.data_offset),
            )
            if info.offset + info.n_bytes > size:
                raise TruncatedFile(
                    f"{self.path}: tensor {info.name} ends at byte {info.offset + info.n_bytes}, "
                    f"but the file has {size} bytes (truncated download?)"
                )
            self.tensors[info.name] = info
        self._raw = {t.name: t for t in self._reader.tensors}
        self.metadata: dict[str, Any] = {}
        for key, field in self._reader.fields.items():
            if key.startswith("GGUF."):
                continue
            self.metadata[key] = _field_value(field)

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if arch is None:
            raise GGUFError(f"{self.path}: general.architecture is missing")
        return str(arch)

    def require_supported(self) -> str:
        """The architecture, if this engine implements it; else UnsupportedArchitecture."""
        arch = self.architecture
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedArchitecture(
                f"{self.path}: architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        unsupported = sorted({t.qtype.name for t in self.tensors.values() if t.qtype not in SUPPORTED})
        if unsupported:
            bad = [t.name for t in self.tensors.values() if t.qtype.name in unsupported][:3]
            raise UnsupportedTensorType(
                f"{self.path}: tensor type(s) {', '.join(unsupported)} are not supported (e.g. {', '.join(bad)}); "
                f"supported: {', '.join(sorted(q.name for q in SUPPORTED))}"
            )
        return arch

    def has(self, name: str) -> bool:
        return name in self.tensors

    def tensor(self, name: str, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dequantize one tensor to a fresh torch tensor (numpy-order shape)."""
        raw = self._raw.get(name)
        if raw is None:
            raise MissingTensor(f"{self.path}: tensor {name!r} is missing")
        info = self.tensors[name]
        out = dequantize(raw.data, info.qtype, info.shape, name=name)
        return out if dtype == torch.float32 else out.to(dtype)

    def stacked(self, names: Sequence[str]) -> torch.Tensor:
        """Float32 tensors of equal row length dequantized one under the other into one allocation: the
        same values as ``torch.cat([self.tensor(n) for n in names])``, without the second copy."""
        for name in names:
            if name not in self._raw:
                raise MissingTensor(f"{self.path}: tensor {name!r} is missing")
        shapes = [self.tensors[n].shape for n in names]
        tails = {s[1:] for s in shapes}
        if len(tails) != 1 or any(len(s) < 1 for s in shapes):
            raise GGUFError(f"{self.path}: tensors {', '.join(names)} cannot be stacked (shapes {shapes})")
        out = torch.empty((sum(s[0] for s in shapes), *shapes[0][1:]), dtype=torch.float32)
        row = 0
        for name, shape in zip(names, shapes, strict=True):
            info = self.tensors[name]
            dequantize(self._raw[name].data, info.qtype, shape, name=name, out=out[row : row + shape[0]])
            row += shape[0]
        return out

    def names(self) -> Iterator[str]:
        return iter(self.tensors)

    def close(self) -> None:
        mm = getattr(self._reader, "data", None)
        if isinstance(mm, np.memmap) and mm._mmap is not None:  # type: ignore[attr-defined]
            mm._mmap.close()  # type: ignore[attr-defined]


def _field_value(field: Any) -> Any:
    """A reader field as a plain Python value (str, int, float, bool, or a list of those)."""
    types = field.types
    if not types:
        return None
    if types[0] == gguf.GGUFValueType.ARRAY:
        if len(field.data) == 1 and isinstance(field.parts[field.data[0]], CompactArray):
            return field.parts[field.data[0]].values()
        sub = types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [_scalar(field.parts[i][0]) for i in field.data]
    if types[0] == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return _scalar(field.parts[field.data[0]][0])


def _scalar(v: Any) -> Any:
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v
