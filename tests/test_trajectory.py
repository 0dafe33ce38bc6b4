"""Trajectory model: segments, format tokens, JSONL round trip."""

import json

import pytest

from hp_agent.trajectory import (
    Segment,
    Trajectory,
    Turn,
    format_token_mask,
    paragraph_segments,
    read_jsonl,
    segments,
    write_jsonl,
)


def _turn(prompt, action, observation=""):
    return Turn(
        prompt_messages=[{"role": "user", "content": "q"}],
        prompt_ids=prompt,
        action_ids=action,
        sample_logprobs=[-0.5] * len(action),
        action_text="a",
        observation=observation,
    )


def test_paragraph_segments_split_at_blank_lines_and_length():
    texts = ["a", "b", ".\n\n", "c", "d", "e", "f", "g"]
    assert paragraph_segments(list(range(8)), texts, max_tokens=3) == [(0, 3), (3, 6), (6, 8)]
    assert paragraph_segments([1], ["x"], max_tokens=5) == [(0, 1)]
    assert paragraph_segments([], [], max_tokens=5) == []
    with pytest.raises(ValueError):
        paragraph_segments([1, 2], ["a"], max_tokens=5)


def test_segments_single_step_vs_multi_turn():
    single = Trajectory("math", "t", "x", turns=[_turn([1], [2, 3, 4])])
    assert segments(single, [["a\n\n", "b", "c"]], 10) == [Segment(0, 0, 1), Segment(0, 1, 3)]
    multi = Trajectory("alfworld", "g", "pick", turns=[_turn([1], [2, 3], "obs"), _turn([1, 2], [4])], multi_turn=True)
    assert segments(multi, [["a", "\n\n"], ["b"]], 10) == [Segment(0, 0, 2), Segment(1, 0, 1)]
    # an ALFWorld episode won in one step is still one segment per turn, not paragraphs
    one_turn = Trajectory("alfworld", "g", "pick", turns=[_turn([1], [2, 3], "You win.")], multi_turn=True)
    assert segments(one_turn, [["a\n\n", "b"]], 10) == [Segment(0, 0, 2)]


def test_format_token_mask_marks_markup_and_special_tokens():
    texts = ["<", "action", ">", "go", " to", " desk", "</action>", "<|im_end|>"]
    assert format_token_mask(texts, "</?action>", ["<|im_end|>"]) == [True, True, True, False, False, False, True, True]
    assert format_token_mask(["\\", "boxed", "{", "4", "}"], r"\\boxed\{|\}") == [True, True, True, False, True]
    assert format_token_mask(["a", "b"], None) == [False, False]


def test_files_without_truncated_turn_flags_read_as_not_truncated(tmp_path):
    path = tmp_path / "old.jsonl"
    turn = {"prompt_messages": [], "prompt_ids": [1], "action_ids": [2], "sample_logprobs": [0.0], "action_text": "x"}
    path.write_text(json.dumps({"env": "keys", "task_id": "g", "task_type": "t", "turns": [turn]}) + "\n")
    (trajectory,) = read_jsonl(path)
    assert trajectory.turns[0].truncated is False


def test_jsonl_round_trip(tmp_path):
    cut = _turn([1], [6, 7])
    cut.truncated = True
    trajectories = [
        Trajectory("math", "t1", "percent", turns=[_turn([1, 2], [3, 4]), cut], reward=1.0, feedback="correct", success=True),
        Trajectory("math", "t2", "geometry", turns=[_turn([1], [5])], group=3, info={"note": "ünïcode"}),
    ]
    path = tmp_path / "t.jsonl"
    write_jsonl(path, trajectories)
    assert list(read_jsonl(path)) == trajectories
    assert [turn["truncated"] for turn in json.loads(path.read_text().splitlines()[0])["turns"]] == [False, True]
    (tmp_path / "bad.jsonl").write_text('{"env": "math"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        list(read_jsonl(tmp_path / "bad.jsonl"))
