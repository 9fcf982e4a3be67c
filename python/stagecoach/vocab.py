"""The character vocabulary `stagectl tokens build` writes (common/text/char_vocabulary.h): a
JSON file {"format": "stagecoach-chars", "version": 1, "chars": [...]}, token i being chars[i].
Use it as the tokenizer of Job.generate() for a GPT trained on character tokens."""

from __future__ import annotations

import json
from typing import Dict, List, Sequence

from stagecoach.errors import InvalidArgument


class CharVocabulary:
    """Text to token ids and back, one id per character."""

    def __init__(self, chars: Sequence[str]):
        for i, c in enumerate(chars):
            if not isinstance(c, str) or len(c) != 1:
                raise InvalidArgument(f"chars[{i}]: expected one character, got {c!r}")
        self.chars: List[str] = list(chars)
        self._ids: Dict[str, int] = {c: i for i, c in enumerate(self.chars)}

    @staticmethod
    def load(path: str) -> "CharVocabulary":
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            raise InvalidArgument(f"{path}: not a character vocabulary: {e}") from None
        if not isinstance(data, dict) or data.get("format") != "stagecoach-chars":
            raise InvalidArgument(f"{path}: not a character vocabulary (format is not "
                                  "'stagecoach-chars')")
        return CharVocabulary(data.get("chars", []))

    def encode(self, text: str) -> List[int]:
        ids = []
        for column, c in enumerate(text):
            if c not in self._ids:
                raise InvalidArgument(f"text column {column + 1}: {c!r} is not in the vocabulary")
            ids.append(self._ids[c])
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            if not 0 <= int(i) < len(self.chars):
                raise InvalidArgument(f"token {i} is outside the vocabulary of {len(self.chars)}")
            out.append(self.chars[int(i)])
        return "".join(out)

    def __len__(self) -> int:
        return len(self.chars)
