"""Staging slots keep their CPU buffers from one save to the next (on every supported torch)."""

from __future__ import annotations

import torch

from mncloud.train.staging import StagingSlots


def test_a_slot_stages_again_and_again_into_the_same_buffers() -> None:
    # torch 2.11's DefaultStager closed its StateDictStager after each stage, so the second
    # stage into a reused slot raised KeyError(<class 'type'>): every save after the warm-up.
    slots = StagingSlots(2)
    state = {"w": torch.ones(4), "optim": {"state": {0: {"m": torch.zeros(3)}}, "lr": 0.1}}
    slots.warm(state, 2, background=False)
    pointers = set()
    for _ in range(3):
        state["w"] += 1
        for slot in (0, 1):
            staged = slots.stage(slot, state)
            assert torch.equal(staged["w"], state["w"]) and staged["optim"]["lr"] == 0.1
            assert staged["w"].data_ptr() != state["w"].data_ptr()  # a copy, not the tensor
            pointers.add((slot, staged["w"].data_ptr()))
    assert len(pointers) == 2  # each slot reused its one buffer: nothing allocated per save
    slots.close()
