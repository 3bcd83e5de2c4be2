"""The app's keys that change the engine: the slots (Ctrl+S), recording a profile (Ctrl+R), re-picking (F3, and
what `--repick auto` decides after a reply), the model picker (F4). A mixin of MoeslotsApp (tui/app.py), which
holds `engine` (engine.api.Engine), the chat store and the busy flag these read."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from textual import work

from .keys import keys_of
from .screens.modals import ConfirmScreen, NameScreen, SlotsScreen
from .store import data_dir

if TYPE_CHECKING:
    from textual.app import App

    from ..engine.api import Engine

    _Base = App[None]
else:
    _Base = object


class EngineActions(_Base):
    engine: "Engine"
    remember: bool
    _generating: bool
    _repick_seen: int
    _keymap: dict[str, str]

    @work(exclusive=True, group="modal")
    async def action_slots(self) -> None:
        if self._generating:
            self.notify(f"stop the reply first ({keys_of('stop', self._keymap)})", severity="warning")
            return
        snap = self.engine.snapshot()
        cur = str(len(snap.layers[0].slot_experts)) if snap.layers and snap.layers[0].slot_experts else "0"
        line = await self.push_screen_wait(SlotsScreen(cur, self.engine.slots_info(), snap.n_expert,
                                                       apply=self.set_slots_now, refuse=self._slots_refusal))
        if line:
            self.notify(line)

    def _slots_refusal(self, value: str) -> str | None:
        """Why the engine would refuse `value` before it tries (in the dialog's words, not the command line's)."""
        if value != "0" and self.engine.profile is None:
            rec = keys_of("record", self._keymap)
            return (f"no profile yet to choose the experts from: record one ({rec}, chat a while, {rec} again "
                    "saves it and offers to apply it)")
        return None

    def set_slots_now(self, value: str) -> str:
        """On a worker thread: the engine's new slots (raises on failure, the old plan kept), then config.toml."""
        line = self.engine.set_slots(value if value == "auto" else int(value))
        if self.remember:
            from . import config

            try:
                profile = self.engine.profile
                config.save_app({"slots": value, "profile": str(profile) if profile else None})
            except (OSError, config.ConfigError) as e:
                self.call_from_thread(self.notify, f"could not save the config: {e}", severity="warning")
        return line

    @work(thread=True, exclusive=True, group="engine", exit_on_error=False)
    def apply_slots(self, value: str) -> None:
        try:
            line = self.set_slots_now(value)
        except Exception as e:  # noqa: BLE001 - notified, state kept
            self.call_from_thread(self.notify, f"slots unchanged: {e}", severity="error", timeout=10)
            return
        self.call_from_thread(self.notify, line)

    @work(exclusive=True, group="modal")
    async def action_record(self) -> None:
        if not self.engine.snapshot().recording:
            self.engine.start_recording()
            self.notify(f"recording routing: chat as usual, {keys_of('record', self._keymap)} again to save the "
                        "profile")
            return
        default = str(data_dir() / "profiles" / f"profile-{time.strftime('%Y%m%d-%H%M%S')}.csv")
        name = await self.push_screen_wait(NameScreen("Save the recorded profile as:", default, what="a file name"))
        if name is None:
            self.notify("still recording (Cancel kept it going)")
            return
        try:
            t = self.engine.stop_recording(Path(name).expanduser())
        except Exception as e:  # noqa: BLE001
            self.notify(f"could not save the profile: {e}", severity="error", timeout=10)
            return
        msg = f"saved {name}: {t.decode_tokens} decode tokens, {t.n_rows} routing rows"
        ov = self.engine.profile_overlap(Path(name).expanduser())
        if ov is not None:
            msg += f"; top-slot overlap with the active profile {100 * ov:.0f} %"
        self.notify(msg, timeout=10)
        if t.decode_tokens:
            if await self.push_screen_wait(ConfirmScreen(f"Apply {Path(name).name} to the slots now? (the chat "
                                                         "is kept)", yes="Apply", no="Not now")):
                self.engine.use_profile(Path(name).expanduser())
                snap = self.engine.snapshot()
                n = len(snap.layers[0].slot_experts) if snap.layers and snap.layers[0].slot_experts else 0
                self.apply_slots(str(n) if n else "auto")

    def _say_auto_switch(self) -> None:
        """`--repick auto` decides again as the chat goes on (after a reply): say so when it switched."""
        try:
            snap = self.engine.snapshot()
        except Exception:  # noqa: BLE001 - e.g. the engine is closing
            return
        if snap.repick_every != self._repick_seen and snap.repick_auto:
            self.notify(snap.repick_auto, title="re-pick (auto)", timeout=12)
        self._repick_seen = snap.repick_every

    def action_models(self) -> None:
        from .screens.models import open_picker

        open_picker(self)

    def action_toggle_repick(self) -> None:
        on = bool(self.engine.snapshot().repick_every)
        self.notify(self.engine.set_repick(0 if on else 16))
        self._repick_seen = 0 if on else 16
