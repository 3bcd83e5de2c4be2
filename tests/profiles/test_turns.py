"""token_matrix keeps every decode token of a merged recording: a short reply followed by a shorter prompt puts the
next turn's positions within max_step of the last ones; the prompt rows between them start a new turn (the
donor's sampled traces lost 13 of 4,033 tokens before)."""

from __future__ import annotations

from moeslots.profiles.simulate import token_matrix
from moeslots.profiles.trace import from_rows


def test_prompt_rows_start_a_new_turn() -> None:
    rows = [(-1, 0, [0, 1]), (-2, 0, [0, 1]), (2, 0, [1, 2]), (3, 0, [2, 3]),    # turn 1: prompt of 2, reply pos 2, 3
            (-1, 0, [4, 5]), (2, 0, [5, 6]), (3, 0, [6, 7]), (4, 0, [7, 0])]     # turn 2: its reply reuses pos 2, 3
    layers, P = token_matrix(from_rows(rows, {"n_expert": "8"}))
    assert layers == [0] and P[:, 0].tolist() == [[1, 2], [2, 3], [5, 6], [6, 7], [7, 0]]


def test_a_verify_batch_still_groups_by_position() -> None:
    rows = [(5, 0, [1, 2]), (5, 1, [3, 4]), (6, 0, [1, 3]), (6, 1, [4, 5])]    # no prompt rows between: one turn
    _, P = token_matrix(from_rows(rows, {"n_expert": "8"}))
    assert P.tolist() == [[[1, 2], [3, 4]], [[1, 3], [4, 5]]]
