"""The app's keys that change the engine: the slots (Ctrl+S), recording a profile (Ctrl+R), re-picking (F3, and
what `--repick auto` decides after a reply), and what the engine has to say (its notices, after a reply or a new
model). A plain object the App owns (tui/app.py): it reads the App's engine now (`engine`, a getter: the model
picker replaces it) and speaks through Textual's App API (notify, dialogs, workers); from a worker thread it posts
a Notice. The App runs the dialog ones as its workers and calls them only while no reply runs. Switching models
is tui/modelswitch.py's."""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any, Callable

from textual.app import App

from ..engine.api import Engine
from ..engine.runtime import passing_thread
from .keys import keys_of
from .messages import Notice
from .screens.modals import ConfirmScreen, NameScreen, SlotsScreen
from .store import data_dir


class EngineActions:
    def __init__(self, app: App[Any], engine: Callable[[], Engine], *, keymap: dict[str, str] | None = None,
                 remember: bool = False) -> None:
        self.app, self._engine, self.keymap = app, engine, dict(keymap or {})
        self.remember = remember           # write slot/profile changes to config.toml (the real app does)
        self.notices_seen = 0              # the engine's notices already shown (more come after replies)
        self.repick_seen = self.engine.snapshot().repick_every    # the interval in force, to say when auto changes it

    @property
    def engine(self) -> Engine:
        return self._engine()

    def engine_changed(self) -> None:
        """Another engine (the model picker): none of its notices shown yet, its re-pick interval the one in force."""
        self.notices_seen = 0
        self.repick_seen = self.engine.snapshot().repick_every

    # -- what the engine has to say ----------------------------------------------------------------------------

    def say_new_notices(self) -> None:
        """The engine's notices not shown yet (at start; after a reply, e.g. the automatic profile's)."""
        notices = list(self.engine.notices)
        for n in notices[self.notices_seen:]:
            self.app.notify(n, timeout=8)
        self.notices_seen = len(notices)

    def say_auto_switch(self) -> None:
        """`--repick auto` decides again as the chat goes on (after a reply): say so when it switched."""
        try:
            snap = self.engine.snapshot()
        except Exception:  # noqa: BLE001 - e.g. the engine is closing
            return
        if snap.repick_every != self.repick_seen and snap.repick_auto:
            self.app.notify(snap.repick_auto, title="re-pick (auto)", timeout=12)
        self.repick_seen = snap.repick_every

    # -- slots --------------------------------------------------------------------------------------------------

    async def slots(self) -> None:
        """Ctrl+S: the slots dialog, which applies the value itself (in a worker: it waits for the dialog)."""
        snap = self.engine.snapshot()
        cur = str(len(snap.layers[0].slot_experts)) if snap.layers and snap.layers[0].slot_experts else "0"
        line = await self.app.push_screen_wait(SlotsScreen(cur, self.engine.slots_info(), snap.n_expert,
                                                           apply=self.set_slots, refuse=self.refusal))
        if line:
            self.app.notify(line)

    def refusal(self, value: str) -> str | None:
        """Why the engine would refuse `value` before it tries (in the dialog's words, not the command line's)."""
        if value != "0" and self.engine.profile is None:
            rec = keys_of("record", self.keymap)
            return (f"no profile yet to choose the experts from: record one ({rec}, chat a while, {rec} again "
                    "saves it and offers to apply it)")
        return None

    def set_slots(self, value: str) -> str:
        """On a worker thread: the engine's new slots (raises on failure, the old plan kept), then config.toml."""
        # (a thread that ends with it: a new plan may calibrate, engine.runtime.passing_thread)
        line = passing_thread.run(lambda: self.engine.set_slots(value if value == "auto" else int(value)),
                                  name="moeslots-slots")
        if self.remember:
            from . import config

            try:
                profile = self.engine.profile
                config.save_app({"slots": value, "profile": str(profile) if profile else None})
            except (OSError, config.ConfigError) as e:
                self.app.post_message(Notice(f"could not save the config: {e}", severity="warning"))
        return line

    def apply_slots(self, value: str) -> None:
        """The slots changed without the dialog (a recorded profile applied): on a worker thread, said when done."""
        self.app.run_worker(functools.partial(self._apply_slots, value), thread=True, exclusive=True,
                            group="engine", exit_on_error=False)

    def _apply_slots(self, value: str) -> None:
        try:
            line = self.set_slots(value)
        except Exception as e:  # noqa: BLE001 - notified, state kept
            self.app.post_message(Notice(f"slots unchanged: {e}", severity="error", timeout=10))
            return
        self.app.post_message(Notice(line))

    # -- record, re-pick --------------------------------------------------------------------------------------

    async def record(self) -> None:
        """Ctrl+R: start recording the routing; again: save the profile, and offer to apply it (in a worker)."""
        engine = self.engine
        if not engine.snapshot().recording:
            engine.start_recording()
            self.app.notify(f"recording routing: chat as usual, {keys_of('record', self.keymap)} again to save the "
                            "profile")
            return
        default = str(data_dir() / "profiles" / f"profile-{time.strftime('%Y%m%d-%H%M%S')}.csv")
        name = await self.app.push_screen_wait(NameScreen("Save the recorded profile as:", default,
                                                          what="a file name"))
        if name is None:
            self.app.notify("still recording (Cancel kept it going)")
            return
        try:
            t = engine.stop_recording(Path(name).expanduser())
        except Exception as e:  # noqa: BLE001
            self.app.notify(f"could not save the profile: {e}", severity="error", timeout=10)
            return
        msg = f"saved {name}: {t.decode_tokens} decode tokens, {t.n_rows} routing rows"
        ov = engine.profile_overlap(Path(name).expanduser())
        if ov is not None:
            msg += f"; top-slot overlap with the active profile {100 * ov:.0f} %"
        self.app.notify(msg, timeout=10)
        if t.decode_tokens:
            if await self.app.push_screen_wait(ConfirmScreen(f"Apply {Path(name).name} to the slots now? (the chat "
                                                             "is kept)", yes="Apply", no="Not now")):
                engine.use_profile(Path(name).expanduser())
                snap = engine.snapshot()
                n = len(snap.layers[0].slot_experts) if snap.layers and snap.layers[0].slot_experts else 0
                self.apply_slots(str(n) if n else "auto")

    def toggle_repick(self) -> None:
        on = bool(self.engine.snapshot().repick_every)
        self.app.notify(self.engine.set_repick(0 if on else 16))
        self.repick_seen = 0 if on else 16
