"""ServeConfig, PoolSizes, ModelKvSpec and KvPlan: the core's records as frozen dataclasses.

Each class is built at import from the field list of its C++ struct
(``torch.ops.ukv.record_fields``: csrc/core/config/serve_config.h, pool_sizes.h,
kv_plan.h), with the C++ defaults and docs, so a field is defined in one
place. A record crosses into C++ and back in its serialised form (a header,
then the fields in order); constructing one validates it in C++, and a bad
value raises ValueError naming the field. Compress types are named by their
ratio (4 = CSA, 128 = HCA) everywhere; rows per block are derived.
"""
from __future__ import annotations

import dataclasses
import numbers
import struct
from typing import Any, Dict, List, Sequence, Tuple

import torch

__all__ = ["ServeConfig", "PoolSizes", "ModelKvSpec", "KvPlan"]

_HEADER = 3  # magic, kind, format version (csrc/core/config/state_io.h)


@dataclasses.dataclass(frozen=True)
class _Field:
    name: str
    kind: str  # int, ints, bool, float, choice, or the name of a nested record
    doc: str
    choices: Tuple[str, ...]


def _as_int(record: str, name: str, value) -> int:
    # numpy integers are common in engines' configs; bools and floats are refused.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{record}.{name} must be an int, got {type(value).__name__} {value!r}")
    return int(value)


def _real_bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", value))[0]


def _bits_real(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def _read_fields(fields: List[_Field], values: List[int], pos: int) -> Tuple[int, Dict[str, Any]]:
    out: Dict[str, Any] = {}
    for f in fields:
        if f.kind == "ints":
            n = values[pos]
            out[f.name], pos = tuple(values[pos + 1: pos + 1 + n]), pos + 1 + n
        elif f.kind == "int":
            out[f.name], pos = values[pos], pos + 1
        elif f.kind == "bool":
            out[f.name], pos = bool(values[pos]), pos + 1
        elif f.kind == "float":
            out[f.name], pos = _bits_real(values[pos]), pos + 1
        elif f.kind == "choice":
            out[f.name], pos = f.choices[values[pos]], pos + 1
        else:
            nested = _RECORDS[f.kind]
            pos, kwargs = _read_fields(nested._fields, values, pos)
            out[f.name] = nested(**kwargs)
    return pos, out


class _Record:
    """What every record class shares: normalisation, encoding, decoding, validation."""

    _record: str
    _fields: List[_Field]
    _header: List[int]

    def __post_init__(self):
        for f in self._fields:
            value = getattr(self, f.name)
            if f.kind == "ints":
                if isinstance(value, (str, bytes)) or not isinstance(value, (Sequence, torch.Tensor)):
                    raise TypeError(f"{self._record}.{f.name} must be a sequence of ints, got {value!r}")
                value = tuple(_as_int(self._record, f.name, v) for v in value)
            elif f.kind == "int":
                value = _as_int(self._record, f.name, value)
            elif f.kind == "bool":
                if not isinstance(value, (bool, numbers.Integral)):
                    raise TypeError(f"{self._record}.{f.name} must be a bool, got {value!r}")
                value = bool(value)
            elif f.kind == "float":
                if isinstance(value, bool) or not isinstance(value, numbers.Real):
                    raise TypeError(f"{self._record}.{f.name} must be a float, got {value!r}")
                value = float(value)
            elif f.kind == "choice":
                if value not in f.choices:
                    raise ValueError(f"{self._record}.{f.name} must be one of {', '.join(f.choices)}, got {value!r}")
            elif not isinstance(value, _RECORDS[f.kind]):
                raise TypeError(f"{self._record}.{f.name} must be a {f.kind}, got {type(value).__name__}")
            object.__setattr__(self, f.name, value)
        torch.ops.ukv.validate_record(self._record, self.encode())

    def encode(self) -> List[int]:
        """The serialised record the C++ side reads."""
        out = list(self._header)
        self._write(out)
        return out

    def _write(self, out: List[int]) -> None:
        for f in self._fields:
            value = getattr(self, f.name)
            if f.kind == "ints":
                out.append(len(value))
                out.extend(value)
            elif f.kind in ("int", "bool"):
                out.append(int(value))
            elif f.kind == "float":
                out.append(_real_bits(value))
            elif f.kind == "choice":
                out.append(f.choices.index(value))
            else:
                value._write(out)

    @classmethod
    def decode(cls, encoded: Sequence[int]):
        """The record a C++ call returned in serialised form."""
        values = list(encoded)
        if values[:_HEADER] != cls._header:
            raise ValueError(f"not a serialised {cls._record}: header {values[:_HEADER]}")
        pos, kwargs = _read_fields(cls._fields, values, _HEADER)
        if pos != len(values):
            raise ValueError(f"serialised {cls._record} has {len(values) - pos} trailing values")
        return cls(**kwargs)

    def replace(self, **changes):
        """A copy with these fields changed, validated like a new record."""
        return dataclasses.replace(self, **changes)


class _ServeConfigMethods:
    @property
    def swa_page(self) -> int:
        """Tokens per SWA page: swa_page_tokens, or block_size when it is 0."""
        return self.swa_page_tokens or self.block_size

    @property
    def compress_ks(self) -> Tuple[int, ...]:
        """Rows per block of each compress type (block_size // ratio), in compress_ratios order."""
        return tuple(self.block_size // r for r in self.compress_ratios)

    @property
    def unified(self) -> bool:
        return self.layout != "static"

    def type_of_ratio(self, ratio: int) -> int:
        """The compress type index of a ratio: its place in compress_ratios."""
        if ratio not in self.compress_ratios:
            raise ValueError(f"compress ratio {ratio} is not one of compress_ratios {self.compress_ratios}")
        return self.compress_ratios.index(ratio)


class _KvPlanMethods:
    """Shortcuts to the plan's configuration and pools."""

    @property
    def mode(self) -> str:
        return self.config.layout

    @property
    def unified(self) -> bool:
        return self.config.unified

    @property
    def num_swa_blocks(self) -> int:
        return self.pools.num_swa_blocks

    @property
    def num_logical_blocks(self) -> int:
        return self.pools.num_logical_blocks

    @property
    def type_slots(self) -> Tuple[int, ...]:
        return self.pools.type_slots

    @property
    def compress_ks(self) -> Tuple[int, ...]:
        return self.config.compress_ks

    def _first_layer(self, ratio: int) -> int:
        if ratio not in self.model.layer_ratios:
            raise ValueError(f"no layer has compress ratio {ratio} (layers: {self.model.layer_ratios})")
        return self.model.layer_ratios.index(ratio)

    def swa_rows(self, ratio: int) -> Tuple[int, ...]:
        """The SWA row constants of the layers with this compress ratio (0: dense
        layers), the ``swa_rows`` of the index ops: page tokens, unit rows,
        offset, group, group stride. One set serves every layer of the class."""
        i = self._first_layer(ratio)
        return self.layer_swa_rows[5 * i: 5 * i + 5]

    def compress_args(self, ratio: int) -> Dict[str, int]:
        """``compress_base`` and ``block_stride`` of the index ops for the layers
        with this compress ratio (the same for every layer of the class)."""
        i = self._first_layer(ratio)
        return {"compress_base": self.layer_compress_bases[i], "block_stride": self.layer_block_strides[i]}


class _NoMethods:
    pass


# Records made only by C++ (a plan) have no defaults; other fields without one.
_REQUIRED = {"KvPlan": None, "ModelKvSpec": {"layer_ratios"}}
_RECORDS: Dict[str, type] = {}


def _build(record: str, methods: type) -> type:
    names, kinds, docs, choices = torch.ops.ukv.record_fields(record)
    fields = [_Field(n, k, d, tuple(c.split(",")) if c else ()) for n, k, d, c in zip(names, kinds, docs, choices)]
    encoded_defaults = list(torch.ops.ukv.record_defaults(record))
    required = _REQUIRED.get(record, set())
    defaults = {} if required is None else _read_fields(fields, encoded_defaults, _HEADER)[1]
    py_type = {"int": int, "ints": Tuple[int, ...], "bool": bool, "float": float, "choice": str}
    spec = []
    for f in fields:
        if required is None or f.name in required:
            spec.append((f.name, py_type.get(f.kind, f.kind)))
        else:
            spec.append((f.name, py_type.get(f.kind, f.kind), dataclasses.field(default=defaults[f.name])))
    doc = "\n".join([f"{record}: the fields of the C++ struct of the same name.", ""] +
                    [f"- ``{f.name}``" + (f" ({' | '.join(f.choices)})" if f.choices else "") + f": {f.doc}"
                     for f in fields])
    cls = dataclasses.make_dataclass(record, spec, bases=(methods, _Record), frozen=True,
                                     namespace={"__doc__": doc, "__module__": __name__})
    cls._record, cls._fields, cls._header = record, fields, encoded_defaults[:_HEADER]
    _RECORDS[record] = cls
    return cls


# Nested records first: a plan's defaults and fields refer to them.
ServeConfig = _build("ServeConfig", _ServeConfigMethods)
PoolSizes = _build("PoolSizes", _NoMethods)
ModelKvSpec = _build("ModelKvSpec", _NoMethods)
KvPlan = _build("KvPlan", _KvPlanMethods)
