"""The state an Engine's parts share, with one owner: the Engine makes one EngineState, and its parts (engine.residency,
engine.autoprofile, engine.autopolicy) read it and change it only through these methods, each under the lock, so
that a snapshot taken on the UI thread never sees half a change.

- `lock`: held by every change below and by a snapshot while it copies (re-entrant: a change may call another);
- `busy`: held while a reply decodes or a plan goes in (one user of the engine's context at a time);
- the configuration in force (`cfg`: what was asked, as re-picks, the automatic profile and F3 change it),
- the plan the cache holds, the decode tokens and the expert bytes uploaded since the engine was made, and whether a
  reply is being generated.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from ..api import EngineConfig
from ..native.expert_cache import SlotPlan


class EngineState:
    def __init__(self, cfg: EngineConfig) -> None:
        self.lock = threading.RLock()
        self._cfg = cfg
        self.busy = threading.Lock()
        self._plan = SlotPlan({})
        self._decode_tokens = 0
        self._upload_bytes = 0
        self._generating = False

    @property
    def cfg(self) -> EngineConfig:
        """The configuration in force (frozen: changed only by configure)."""
        return self._cfg

    def configure(self, **changes: Any) -> EngineConfig:
        """Change fields of the configuration in force (checked as EngineConfig checks: a moving policy and re-picks
        refuse each other); returns the new one."""
        with self.lock:
            self._cfg = dataclasses.replace(self._cfg, **changes)
            return self._cfg

    @property
    def plan(self) -> SlotPlan:
        """The slots the cache holds now (the tier's residents included, as last read)."""
        return self._plan

    @property
    def decode_tokens(self) -> int:
        return self._decode_tokens

    @property
    def upload_bytes(self) -> int:
        """Expert bytes copied into slots (re-picks, a tier's uploads, the scheduler's copies) since the start."""
        return self._upload_bytes

    @property
    def generating(self) -> bool:
        return self._generating

    def set_plan(self, plan: SlotPlan) -> None:
        """The cache holds `plan` now (a plan applied, a re-pick's swaps, what a tier left)."""
        with self.lock:
            self._plan = plan

    def add_uploads(self, nbytes: int) -> None:
        with self.lock:
            self._upload_bytes += nbytes

    def add_decoded(self, tokens: int) -> None:
        with self.lock:
            self._decode_tokens += tokens

    def set_generating(self, on: bool) -> None:
        with self.lock:
            self._generating = on
