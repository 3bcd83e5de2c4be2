"""Fakes shared by the tests: FakeEngine, the engine as the app sees it (engine.api.Engine), scripted; FastEngine
(tokens as fast as it can)."""

from __future__ import annotations

import time
from pathlib import Path

from moeslots.engine.api import Done, LayerSnapshot, Sampling, Snapshot, TextDelta, TurnStats


class FakeEngine:
    """The engine as the app sees it (engine.api.Engine), scripted: a reply word by word, a fixed snapshot of
    `layers` MoE layers (numbered from 1) with `slots` of `n_expert` experts each; recent hits follow a fixed
    pattern (snapshots are deterministic)."""

    def __init__(self, reply: str = "Hello **there**, this is a reply.", delay: float = 0.0, *, slots: int = 4,
                 layers: int = 2, n_expert: int = 16, prefill: float = 0.0):
        self.reply, self.delay, self.prefill = reply, delay, prefill
        self.n_layers, self.n_expert = layers, n_expert
        self.load_line = f"expert cache: {layers} layers x {slots} slots, 1.0 MiB uploaded to host memory"
        self.notices: list[str] = []
        self.slots = slots
        self.recording = False
        self.recorded_tokens = 0
        self.repick_every = 0
        self.profile: Path | None = Path("fake-profile.csv")
        self.seen: list = []
        self.sampling_seen: list[Sampling | None] = []
        self.max_tokens_seen: list[int | None] = []
        self.whatif = f"what-if @{slots}: static 60 %  lru 40 %  re-elect 55 %"
        self.mtp = (7, 10)                                  # accepted, drafted

    def chat(self, messages, cancel=None, sampling=None, max_tokens=None):
        self.seen.append(list(messages))
        self.sampling_seen.append(sampling)
        self.max_tokens_seen.append(max_tokens)
        words = self.reply.split(" ")[:max_tokens or None]   # a word a token: max_tokens cuts the reply
        out = []
        if self.prefill:                                   # the prompt being read: no text, no look at cancel
            time.sleep(self.prefill)
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
        n = self.slots
        layers = tuple(LayerSnapshot(il, tuple(range(n)) if n <= 4 else tuple((il * 7 + j) % self.n_expert
                                                                                for j in range(n)),
                                     tuple((j * 13 + il * 29) % 37 if n > 4 else n - j for j in range(n)),
                                     tuple([10] * n), 0.5, ((il * 17) % 23) / 40 if n > 4 else 0.4)
                       for il in range(1, self.n_layers + 1))
        return Snapshot("fake", self.load_line, layers, 0.6, 3.2, 0.0, 42.0, (30.0, 42.0), 500.0, self.mtp[1],
                        self.mtp[0], 1 << 20, self.recording, False, self.whatif, repick_every=self.repick_every,
                        n_expert=self.n_expert)

    def set_slots(self, n):
        if self.profile is None and n not in (0, None):       # as the engine words it (command-line flags)
            raise ValueError(f"--slots {n} needs a profile to choose the experts: record one with `moeslots record "
                             "MODEL --prompt-file F -o P.csv` and pass --profile P.csv")
        if n == 99:
            raise ValueError("99 slots per layer do not fit: 9.9 GiB needed, 2.0 GiB free")
        if n == "auto":
            n = 12
        self.slots = n
        self.load_line = f"expert cache: {self.n_layers} layers x {n} slots"
        return self.load_line

    def start_recording(self) -> None:
        self.recording = True

    def stop_recording(self, path: Path):
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

    def chat(self, messages, cancel=None, sampling=None):
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
