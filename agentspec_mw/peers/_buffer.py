"""A growable int32 token buffer (amortised O(1) append, zero-copy views)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class TokenBuffer:
    """Prompt + output token ids of one request, as a contiguous int32 array."""

    __slots__ = ("_data", "_len")

    def __init__(self, token_ids: Sequence[int] | np.ndarray, headroom: int = 256) -> None:
        arr = np.asarray(token_ids, dtype=np.int32)
        self._data = np.empty(max(len(arr) + headroom, 16), dtype=np.int32)
        self._data[: len(arr)] = arr
        self._len = len(arr)

    def extend(self, token_ids: Sequence[int] | np.ndarray) -> None:
        """Append tokens, doubling the capacity when needed."""
        n = len(token_ids)
        if self._len + n > len(self._data):
            grown = np.empty(max(2 * len(self._data), self._len + n), dtype=np.int32)
            grown[: self._len] = self._data[: self._len]
            self._data = grown
        self._data[self._len : self._len + n] = token_ids
        self._len += n

    def view(self) -> np.ndarray:
        """The tokens so far (a view: valid until the next ``extend``)."""
        return self._data[: self._len]

    def tail(self, n: int) -> np.ndarray:
        """The last ``n`` tokens (fewer if the buffer is shorter)."""
        return self._data[max(0, self._len - n) : self._len]

    def __len__(self) -> int:
        return self._len
