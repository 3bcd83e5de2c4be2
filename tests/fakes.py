"""Fakes shared by the tests: FakeEngine, the engine as the app sees it (engine.api.Engine), scripted."""

from __future__ import annotations

import time
from pathlib import Path

from moeslots.engine.api import Done, LayerSnapshot, Snapshot, TextDelta, TurnStats


class FakeEngine:
    """The engine as the app sees it (engine.api.Engine), scripted: a reply word by word, a fixed snapshot."""

    def __init__(self, reply: str = "Hello **there**, this is a reply.", delay: float = 0.0):
        self.reply, self.delay = reply, delay
        self.load_line = "expert cache: 2 layers x 4 slots, 1.0 MiB uploaded to host memory"
        self.notices: list[str] = []
        self.slots = 4
        self.recording = False
        self.recorded_tokens = 0
        self.repick_every = 0
        self.profile: Path | None = None
        self.seen: list = []

    def chat(self, messages, cancel=None):  # noqa: ANN001
        self.seen.append(list(messages))
        words = self.reply.split(" ")
        out = []
        for i, w in enumerate(words):
            if self.delay:
                time.sleep(self.delay)
            if cancel is not None and cancel.is_set():
                break
            piece = (" " if i else "") + w
            out.append(piece)
            yield TextDelta(piece)
        yield Done(TurnStats(5, 0.01, len(out), 0.1, cancel is not None and cancel.is_set(), 0.5), "".join(out))

    def snapshot(self) -> Snapshot:
        layers = tuple(LayerSnapshot(il, tuple(range(self.slots)), tuple(range(self.slots, 0, -1)),
                                     tuple([10] * self.slots), 0.5, 0.4) for il in (1, 2))
        return Snapshot("fake", self.load_line, layers, 0.6, 3.2, 0.0, 42.0, (30.0, 42.0), 500.0, 10, 7,
                        1 << 20, self.recording, False, "what-if @4: static 60 %  lru 40 %  re-elect 55 %",
                        repick_every=self.repick_every)

    def set_slots(self, n):  # noqa: ANN001
        if n == 99:
            raise ValueError("99 slots: the model has 16 experts")
        self.slots = n
        self.load_line = f"expert cache: 2 layers x {n} slots"
        return self.load_line

    def start_recording(self) -> None:
        self.recording = True

    def stop_recording(self, path: Path):  # noqa: ANN201
        self.recording = False
        path.write_text("pos,layer,id0\n0,1,2\n")
        from moeslots.profiles.trace import read_csv

        return read_csv(path)

    def use_profile(self, path: Path) -> None:
        self.profile = path

    def profile_overlap(self, path: Path) -> float:
        return 0.5

    def set_repick(self, every: int) -> str:
        self.repick_every = every
        return f"re-pick every {every} tokens" if every else "static residency (no re-picks)"

    def slots_info(self) -> str:
        return "one slot per layer = 1 MiB; pack now 1 MiB; fits up to 12 (auto)"

    def new_chat(self) -> None:
        pass

    def close(self) -> None:
        pass


class FastEngine(FakeEngine):
    """Replies with `n` tokens as fast as it can: the app must not redraw per token."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.load_line = "fake"
        self._snap = Snapshot("fake", "fake", (LayerSnapshot(1, (0, 1), (1, 1), (1, 1), 0.5, 0.5),), 0.5, 1.0, 0.0,
                              0.0, (), 0.0, 0, 0, 0, False, False)

    def chat(self, messages, cancel=None):  # noqa: ANN001, ANN201
        words = []
        for i in range(self.n):
            w = f"w{i}" + ("\n\n" if i % 40 == 39 else " ")
            words.append(w)
            yield TextDelta(w)
            if i % 10 == 0:
                time.sleep(0.004)                           # 4000 tokens in about 2 s
        yield Done(TurnStats(1, 0.01, self.n, 0.5, False, 0.5), "".join(words))

    def snapshot(self) -> Snapshot:
        return self._snap
