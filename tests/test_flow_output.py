"""The terminal of `make run`: the stages' own lines; DVC's and Lightning's chatter go to Prefect only."""

import pytest

from flows.full_pipeline import for_terminal


@pytest.mark.parametrize("stage, line", [
    ("warmup", "epoch 3 (232s): val rehearsal exact 0.037, weakest tool cancel_order 0.000"),
    ("warmup", "warmup: 20 epoch(s) in 1300s"),
    ("train@envace", "train[envace]: 50 steps in 200s; last reward 0.7"),
    ("evaluate", "evaluate[sft]: success 0.600 [0.56, 0.64] on 646 held-out tasks"),
    ("prepare", "ERROR: failed to reproduce 'prepare': ..."),
])
def test_a_stages_own_lines_and_errors_reach_the_terminal(stage, line):
    assert for_terminal(stage, line)


@pytest.mark.parametrize("stage, line", [
    ("collect", "\tgit add dvc.lock"),
    ("collect", "To track the changes with git, run:"),
    ("collect", "Use `dvc push` to send your updates to remote storage."),
    ("warmup", "Running stage 'warmup':"),
    ("warmup", "Stage 'collect' didn't change, skipping"),
    ("warmup", "💡 Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"),
    ("warmup", "GPU available: False, used: False"),
    ("warmup", "/x/lightning/pytorch/utilities/_pytree.py:21: `isinstance(treespec, LeafSpec)` is deprecated"),
    ("evaluate", "warmup: a line of another stage"),
])
def test_tool_chatter_stays_out_of_the_terminal(stage, line):
    assert not for_terminal(stage, line)
