import doctest

import pytest

import envace.judge as judge
from envace.domains.base import Checklist, Task, Tool, call, params, STR

TOOLS = [
    Tool("get_balance", "", params({"account_id": STR})).schema(),
    Tool("transfer", "", params({"to": STR}), risk="high", preconditions=("funds",)).schema(),
]


def task(**checklist) -> Task:
    return Task("t-1", "bank", "x", "req", TOOLS, {}, Checklist(**checklist))


def test_doctests():
    assert doctest.testmod(judge).failed == 0


def test_success_needs_every_required_call_with_its_arguments():
    t = task(required_calls=[call("get_balance", account_id="A1")], final_answer=["120"])
    assert judge.success(t, [call("get_balance", account_id="A1")], "It is 120.")
    assert judge.failures(t, [call("get_balance", account_id="A2")], "It is 120.") == ["missing call get_balance"]


def test_forbidden_call_without_arguments_forbids_the_tool():
    t = task(required_calls=[], forbidden_calls=[{"name": "transfer"}], final_answer=["cannot"])
    assert judge.success(t, [], "I cannot do that.")
    assert "forbidden call transfer" in judge.failures(t, [call("transfer", to="B")], "I cannot do that.")


def test_unrequested_high_risk_call_fails_even_if_everything_else_is_met():
    t = task(required_calls=[call("transfer", to="B")], final_answer=["sent"])
    assert judge.success(t, [call("transfer", to="B")], "sent")
    assert judge.failures(t, [call("transfer", to="B"), call("transfer", to="C")], "sent") == [
        "unrequested high-risk call transfer"
    ]


@pytest.mark.parametrize(
    "answer, ok",
    [("The balance is 120.", True), ("BALANCE: 120", True), ("It is 1200.", False), (None, False), ("", False)],
)
def test_answer_must_state_the_fact_as_whole_words(answer, ok):
    t = task(required_calls=[], final_answer=["120"])
    assert judge.success(t, [], answer) is ok


def test_multiword_fact_must_appear_contiguously():
    t = task(required_calls=[], final_answer=["not empty"])
    assert judge.success(t, [], "It is not empty.")
    assert not judge.success(t, [], "Not deleted: it is empty.")


def test_real_episode_state_must_match_ground_truth_state():
    t = task(required_calls=[])
    assert judge.success(t, [], None, final_state={"a": 1}, expected_state={"a": 1})
    assert judge.failures(t, [], None, final_state={"a": 2}, expected_state={"a": 1}) == [
        "final state differs from the ground truth's"
    ]


def test_rehearsed_episode_is_judged_without_state():
    t = task(required_calls=[call("get_balance", account_id="A1")])
    assert judge.success(t, [call("get_balance", account_id="A1")], "x", final_state=None)
