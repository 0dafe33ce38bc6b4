"""Subgoal shaping for ALFWorld training: which commands pay, and that success never includes it."""

from __future__ import annotations

import pytest

from hp_agent.envs.alfworld.subgoals import SubgoalTracker, task_object

HEAT_TASK = "train/pick_heat_then_place_in_recep-Apple-None-CounterTop-23/trial_synth_s0_000195"


def test_task_object_is_the_folder_object_as_players_name_it():
    assert task_object("valid_unseen/look_at_obj_in_light-AlarmClock-None-DeskLamp-308/trial_T1") == "alarmclock"
    assert task_object(HEAT_TASK) == "apple"
    with pytest.raises(ValueError, match="has no '<type>-<Object>"):
        task_object("train/no-folder")


def test_only_the_task_object_and_its_device_pay_once_each():
    tracker = SubgoalTracker(HEAT_TASK, "heat")
    assert tracker.step("take mug 2 from countertop 1", True) == []  # the wrong object
    assert tracker.step("heat mug 2 with microwave 1", True) == []
    assert tracker.step("move mug 2 to sinkbasin 1", True) == []
    assert tracker.step("take apple 2 from fridge 1", False) == []  # the game refused it
    assert tracker.step("take apple 2 from fridge 1", True) == ["hold"]
    assert tracker.step("cool apple 2 with fridge 1", True) == []  # not the task's device
    assert tracker.step("heat apple 2 with microwave 1", True) == ["apply"]
    assert tracker.step("move apple 2 to countertop 1", True) == []
    assert tracker.step("take apple 2 from countertop 1", True) == []  # paid once per episode
    assert tracker.step("heat apple 2 with microwave 1", True) == []


def test_the_lamp_pays_only_with_the_object_in_hand():
    tracker = SubgoalTracker("train/look_at_obj_in_light-Book-None-DeskLamp-301/trial_x", "look")
    assert tracker.step("use desklamp 1", True) == []
    assert tracker.step("take book 1 from bed 1", True) == ["hold"]
    assert tracker.step("use desklamp 1", True) == ["apply"]
    pick = SubgoalTracker("train/pick_and_place_simple-Book-None-Desk-301/trial_x", "pick")
    assert pick.step("take book 1 from bed 1", True) == ["hold"]
    assert pick.step("use desklamp 1", True) == []  # pick tasks have no device step
