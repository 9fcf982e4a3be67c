"""NumPy arrays and torch tensors to and from the API's TensorData (dtype, shape, little-endian
row-major bytes), and ragged rows (token rows of different lengths) padded for a step.

torch is optional: a torch tensor is converted through NumPy, and results come back as torch
tensors only when the inputs were torch tensors.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from stagecoach.errors import InvalidArgument
from stagecoach.v1 import types_pb2

# The dtypes TensorData carries, by NumPy dtype.
_DTYPES = {
    np.dtype(np.float32): "float32",
    np.dtype(np.float64): "float64",
    np.dtype(np.int64): "int64",
    np.dtype(np.int32): "int32",
}
_NUMPY = {name: dtype for dtype, name in _DTYPES.items()}

IGNORED_TARGET = -100  # a target the loss does not count (padding, a prompt's tokens)


def is_torch(value: Any) -> bool:
    """Whether `value` is a torch tensor (without importing torch when it is not loaded)."""
    return type(value).__module__.startswith("torch") and hasattr(value, "detach")


def as_numpy(value: Any, what: str) -> np.ndarray:
    """`value` (a NumPy array, a torch tensor, or nested lists of numbers) as a NumPy array."""
    if is_torch(value):
        value = value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype == np.bool_ or array.dtype.kind not in "fiu":
        raise InvalidArgument(f"{what}: expected numbers, got an array of {array.dtype}")
    if array.dtype.kind == "u" or array.dtype == np.int16 or array.dtype == np.int8:
        array = array.astype(np.int64)
    if array.dtype == np.float16:
        array = array.astype(np.float32)
    return array


def to_tensor_data(value: Any, what: str) -> types_pb2.TensorData:
    """`value` as TensorData. InvalidArgument naming `what` for an unsupported dtype or a
    scalar (the API's tensors have a batch dimension)."""
    array = as_numpy(value, what)
    if array.ndim == 0:
        raise InvalidArgument(f"{what}: expected at least one dimension (the rows), got a scalar")
    if array.dtype not in _DTYPES:
        raise InvalidArgument(
            f"{what}: dtype {array.dtype} is not one of float32, float64, int64, int32")
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    return types_pb2.TensorData(dtype=_DTYPES[array.dtype], shape=list(array.shape),
                                data=np.ascontiguousarray(little).tobytes())


def from_tensor_data(data: types_pb2.TensorData, as_torch: bool = False) -> Any:
    """TensorData as a NumPy array (a torch tensor with `as_torch`)."""
    if data.dtype not in _NUMPY:
        raise InvalidArgument(f"the server sent a tensor of dtype '{data.dtype}'")
    dtype = _NUMPY[data.dtype].newbyteorder("<")
    array = np.frombuffer(data.data, dtype=dtype).astype(_NUMPY[data.dtype]).reshape(
        tuple(data.shape))
    if as_torch:
        import torch  # optional: only when the caller gave torch tensors

        return torch.from_numpy(array.copy())
    return array


def is_ragged(rows: Any) -> bool:
    """Whether `rows` is a list of token rows rather than one array: a list or tuple whose items
    are 1-D sequences not all of one length (or an object array of such rows)."""
    if isinstance(rows, np.ndarray):
        return rows.dtype == object
    if not isinstance(rows, (list, tuple)) or not rows:
        return False
    lengths = set()
    for row in rows:
        if is_torch(row) or isinstance(row, np.ndarray):
            if row.ndim != 1:
                return False
            lengths.add(int(row.shape[0]))
        elif isinstance(row, (list, tuple)):
            lengths.add(len(row))
        else:
            return False
    return len(lengths) > 1


def _int_row(row: Any, what: str) -> np.ndarray:
    array = as_numpy(row, what)
    if array.ndim != 1:
        raise InvalidArgument(f"{what}: a row must be 1-D token ids, got shape {array.shape}")
    if array.dtype.kind != "i":
        raise InvalidArgument(f"{what}: token ids must be integers, got {array.dtype}")
    return array.astype(np.int64)


def pad_rows(inputs: Sequence[Any], targets: Optional[Sequence[Any]]
             ) -> Tuple[np.ndarray, Optional[np.ndarray], List[int]]:
    """Ragged token rows padded to the longest: inputs with id 0, targets with IGNORED_TARGET,
    and each row's length. Targets, when given, pair with the inputs row by row and length by
    length. InvalidArgument names the row."""
    rows = [_int_row(r, f"inputs row {i}") for i, r in enumerate(inputs)]
    if not rows:
        raise InvalidArgument("inputs: no rows")
    for i, r in enumerate(rows):
        if r.shape[0] == 0:
            raise InvalidArgument(f"inputs row {i}: empty")
        if (r < 0).any():
            raise InvalidArgument(f"inputs row {i}: token ids must be >= 0")
    longest = max(r.shape[0] for r in rows)
    padded = np.zeros((len(rows), longest), dtype=np.int64)
    for i, r in enumerate(rows):
        padded[i, : r.shape[0]] = r
    padded_targets = None
    if targets is not None:
        target_rows = [_int_row(t, f"targets row {i}") for i, t in enumerate(targets)]
        if len(target_rows) != len(rows):
            raise InvalidArgument(
                f"targets: {len(target_rows)} rows for {len(rows)} input rows")
        padded_targets = np.full((len(rows), longest), IGNORED_TARGET, dtype=np.int64)
        for i, (r, t) in enumerate(zip(rows, target_rows)):
            if t.shape[0] != r.shape[0]:
                raise InvalidArgument(
                    f"targets row {i}: {t.shape[0]} targets for {r.shape[0]} inputs")
            padded_targets[i, : t.shape[0]] = t
    return padded, padded_targets, [int(r.shape[0]) for r in rows]
