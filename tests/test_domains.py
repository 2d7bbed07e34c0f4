"""Behaviour of the three tool domains (bank, files, trading) and the shared Backend contract.

Scenarios are written by hand, in the shape each domain's `make_task` produces, so every
expectation is exact.
"""

from __future__ import annotations

import copy

import pytest

from envace.data.demonstrations import generate_tasks
from envace.domains import DOMAINS, get_domain
from envace.domains.base import Tool, params


def call(name, /, **arguments):
    return {"name": name, "arguments": arguments}


def error_code(response):
    assert set(response) == {"error"}, response
    assert set(response["error"]) == {"code", "message"}
    assert isinstance(response["error"]["message"], str) and response["error"]["message"]
    return response["error"]["code"]


# --------------------------------------------------------------------------- scenarios

def bank_scenario():
    return {
        "accounts": [
            {"account_id": "A10", "owner": "Alice", "balance": 100},
            {"account_id": "A20", "owner": "Bob", "balance": 30},
            {"account_id": "A30", "owner": "Carol", "balance": 0},
        ]
    }


def files_scenario():
    return {
        "folders": [
            {
                "folder_id": "D10", "name": "old_reports",
                "files": [
                    {"file_id": "F10", "name": "q1.pdf", "size_kb": 120},
                    {"file_id": "F11", "name": "notes.txt", "size_kb": 5},
                ],
            },
            {"folder_id": "D20", "name": "tmp_scans", "files": []},
            {
                "folder_id": "D30", "name": "work_plans",
                "files": [{"file_id": "F30", "name": "plan.docx", "size_kb": 40}],
            },
        ]
    }


def trading_scenario():
    return {
        "account_info": {"account_id": 12345, "balance": 1000.0, "binding_card": 1234567890123456},
        "authenticated": True,
        "market_status": "Open",
        "order_counter": 1003,
        "orders": [
            {"id": 1001, "order_type": "Buy", "symbol": "AAPL", "price": 100.0, "amount": 2, "status": "Pending"},
            {"id": 1002, "order_type": "Sell", "symbol": "TSLA", "price": 200.0, "amount": 1, "status": "Completed"},
        ],
        "stocks": {
            "AAPL": {"price": 100.0, "percent_change": 0.5, "volume": 1.5, "MA(5)": 99.0, "MA(20)": 98.0},
            "TSLA": {"price": 200.0, "percent_change": -1.2, "volume": 2.5, "MA(5)": 201.0, "MA(20)": 205.0},
        },
        "watch_list": [],
        "transaction_history": [],
    }


SCENARIOS = {"bank": bank_scenario, "files": files_scenario, "trading": trading_scenario}


def backend(domain_name, scenario=None):
    return get_domain(domain_name).backend(scenario if scenario is not None else SCENARIOS[domain_name]())


def snapshot(b):
    """A deep copy of the state (bank/files `state()` return live rows)."""
    return copy.deepcopy(b.state())


@pytest.fixture
def bank():
    return backend("bank")


@pytest.fixture
def files():
    return backend("files")


@pytest.fixture
def trading():
    return backend("trading")


def balances(bank_backend):
    return {a["account_id"]: a["balance"] for a in bank_backend.state()["accounts"]}


# --------------------------------------------------------------------------- bank

def test_bank_find_account_returns_the_owners_id(bank):
    assert bank.execute(call("find_account", owner="Bob")) == {"account_id": "A20"}


def test_bank_find_account_unknown_owner_is_not_found(bank):
    assert error_code(bank.execute(call("find_account", owner="Mallory"))) == "not_found"


def test_bank_get_balance(bank):
    assert bank.execute(call("get_balance", account_id="A10")) == {"account_id": "A10", "balance": 100}


def test_bank_get_balance_unknown_account(bank):
    assert error_code(bank.execute(call("get_balance", account_id="A99"))) == "unknown_account"


def test_bank_transfer_moves_money_between_both_accounts(bank):
    response = bank.execute(call("transfer", from_account="A10", to_account="A20", amount=40))
    assert response == {"status": "completed", "amount": 40}
    assert balances(bank) == {"A10": 60, "A20": 70, "A30": 0}


def test_bank_transfer_of_the_whole_balance_is_allowed(bank):
    response = bank.execute(call("transfer", from_account="A20", to_account="A30", amount=30))
    assert response == {"status": "completed", "amount": 30}
    assert balances(bank) == {"A10": 100, "A20": 0, "A30": 30}


def test_bank_transfer_insufficient_funds_leaves_state_unchanged(bank):
    before = snapshot(bank)
    response = bank.execute(call("transfer", from_account="A20", to_account="A10", amount=31))
    assert error_code(response) == "insufficient_funds"
    assert bank.state() == before


@pytest.mark.parametrize("amount", [0, -10])
def test_bank_transfer_non_positive_amount_is_invalid(bank, amount):
    before = snapshot(bank)
    response = bank.execute(call("transfer", from_account="A10", to_account="A20", amount=amount))
    assert error_code(response) == "invalid_amount"
    assert bank.state() == before


def test_bank_transfer_to_the_same_account_is_refused(bank):
    before = snapshot(bank)
    response = bank.execute(call("transfer", from_account="A10", to_account="A10", amount=10))
    assert error_code(response) == "same_account"
    assert bank.state() == before


@pytest.mark.parametrize("src, dst", [("A99", "A10"), ("A10", "A99")])
def test_bank_transfer_unknown_account(bank, src, dst):
    before = snapshot(bank)
    response = bank.execute(call("transfer", from_account=src, to_account=dst, amount=10))
    assert error_code(response) == "unknown_account"
    assert bank.state() == before


def test_bank_state_lists_accounts_sorted_by_id():
    scenario = bank_scenario()
    scenario["accounts"].reverse()
    assert backend("bank", scenario).state() == bank_scenario()


def test_bank_backend_does_not_mutate_its_scenario():
    scenario = bank_scenario()
    b = backend("bank", scenario)
    b.execute(call("transfer", from_account="A10", to_account="A20", amount=40))
    assert scenario == bank_scenario()


def test_bank_facts_of_transfer_are_both_account_rows(bank):
    facts = bank.facts(call("transfer", from_account="A10", to_account="A20", amount=40))
    assert sorted(facts["accounts"], key=lambda a: a["account_id"]) == bank_scenario()["accounts"][:2]


def test_bank_facts_of_find_account_match_by_owner(bank):
    assert bank.facts(call("find_account", owner="Carol")) == {"accounts": [bank_scenario()["accounts"][2]]}


def test_bank_facts_of_transfer_say_whether_the_balance_covers_it(bank):
    ok = bank.facts(call("transfer", from_account="A10", to_account="A20", amount=40))
    too_much = bank.facts(call("transfer", from_account="A10", to_account="A20", amount=10**6))
    assert ok["balance_covers_amount"] is True and too_much["balance_covers_amount"] is False


def test_bank_facts_of_unknown_values_are_empty(bank):
    assert bank.facts(call("get_balance", account_id="A99")) == {"accounts": []}


# --------------------------------------------------------------------------- files

def test_files_find_folder(files):
    assert files.execute(call("find_folder", name="tmp_scans")) == {"folder_id": "D20"}


def test_files_find_folder_unknown_name_is_not_found(files):
    assert error_code(files.execute(call("find_folder", name="no_such"))) == "not_found"


def test_files_list_folder_returns_file_names(files):
    assert files.execute(call("list_folder", folder_id="D10")) == {"folder_id": "D10", "files": ["q1.pdf", "notes.txt"]}


def test_files_list_empty_folder(files):
    assert files.execute(call("list_folder", folder_id="D20")) == {"folder_id": "D20", "files": []}


def test_files_list_unknown_folder(files):
    assert error_code(files.execute(call("list_folder", folder_id="D99"))) == "unknown_folder"


def test_files_get_file_info(files):
    response = files.execute(call("get_file_info", folder_id="D10", file_name="notes.txt"))
    assert response == {"file_id": "F11", "size_kb": 5}


def test_files_get_file_info_missing_file_is_not_found(files):
    response = files.execute(call("get_file_info", folder_id="D30", file_name="q1.pdf"))
    assert error_code(response) == "not_found"


def test_files_get_file_info_unknown_folder(files):
    response = files.execute(call("get_file_info", folder_id="D99", file_name="q1.pdf"))
    assert error_code(response) == "unknown_folder"


def test_files_delete_file_removes_only_that_file(files):
    assert files.execute(call("delete_file", file_id="F10")) == {"deleted": "F10"}
    expected = files_scenario()
    del expected["folders"][0]["files"][0]
    assert files.state() == expected


def test_files_delete_unknown_file(files):
    before = snapshot(files)
    assert error_code(files.execute(call("delete_file", file_id="F99"))) == "unknown_file"
    assert files.state() == before


def test_files_delete_empty_folder(files):
    assert files.execute(call("delete_folder", folder_id="D20")) == {"deleted": "D20"}
    assert [f["folder_id"] for f in files.state()["folders"]] == ["D10", "D30"]


def test_files_delete_nonempty_folder_is_refused_and_state_unchanged(files):
    before = snapshot(files)
    assert error_code(files.execute(call("delete_folder", folder_id="D30"))) == "not_empty"
    assert files.state() == before


def test_files_delete_unknown_folder(files):
    before = snapshot(files)
    assert error_code(files.execute(call("delete_folder", folder_id="D99"))) == "unknown_folder"
    assert files.state() == before


def test_files_folder_becomes_deletable_once_emptied(files):
    assert files.execute(call("delete_file", file_id="F30")) == {"deleted": "F30"}
    assert files.execute(call("delete_folder", folder_id="D30")) == {"deleted": "D30"}


def test_files_state_lists_folders_sorted_by_id():
    scenario = files_scenario()
    scenario["folders"].reverse()
    assert backend("files", scenario).state() == files_scenario()


def test_files_backend_does_not_mutate_its_scenario():
    scenario = files_scenario()
    b = backend("files", scenario)
    b.execute(call("delete_file", file_id="F10"))
    b.execute(call("delete_folder", folder_id="D20"))
    assert scenario == files_scenario()


@pytest.mark.parametrize(
    "tool_call, expected",
    [
        (call("find_folder", name="work_plans"), {"folder": {"folder_id": "D30", "name": "work_plans"}}),
        (call("find_folder", name="nope"), {"folder": None}),
        (call("list_folder", folder_id="D10"), {"folder": {"folder_id": "D10", "files": ["q1.pdf", "notes.txt", "-", "-"]}}),
        (call("delete_folder", folder_id="D20"), {"folder": {"folder_id": "D20", "files": ["-"] * 4}}),
        (call("delete_folder", folder_id="D99"), {"folder": None}),
        (call("get_file_info", folder_id="D10", file_name="q1.pdf"),
         {"folder_exists": True, "file": {"file_id": "F10", "name": "q1.pdf", "size_kb": 120}}),
        (call("get_file_info", folder_id="D10", file_name="x.txt"), {"folder_exists": True, "file": None}),
        (call("get_file_info", folder_id="D99", file_name="q1.pdf"), {"folder_exists": False, "file": None}),
        (call("delete_file", file_id="F30"), {"file": {"file_id": "F30", "name": "plan.docx", "size_kb": 40}}),
    ],
)
def test_files_facts_are_only_what_the_call_touches(files, tool_call, expected):
    assert files.facts(tool_call) == expected


# --------------------------------------------------------------------------- trading

def test_trading_get_symbol_by_name(trading):
    assert trading.execute(call("get_symbol_by_name", name="Tesla")) == {"symbol": "TSLA"}


def test_trading_get_symbol_by_unknown_name_is_bfcls_sentinel(trading):
    # BFCL answers an unknown company with a value, not an error.
    assert trading.execute(call("get_symbol_by_name", name="Nobody Inc")) == {"symbol": "Stock not found"}


def test_trading_get_stock_info(trading):
    assert trading.execute(call("get_stock_info", symbol="AAPL")) == trading_scenario()["stocks"]["AAPL"]


def test_trading_get_stock_info_unknown_symbol_keeps_bfcl_message(trading):
    response = trading.execute(call("get_stock_info", symbol="XXXX"))
    assert error_code(response) == "not_found"
    assert response["error"]["message"] == "Stock with symbol 'XXXX' not found."


def test_trading_responses_are_copies_of_backend_state(trading):
    info = trading.execute(call("get_stock_info", symbol="AAPL"))
    info["price"] = -1
    assert trading.state()["stocks"]["AAPL"]["price"] == 100.0


def test_trading_get_account_info(trading):
    assert trading.execute(call("get_account_info")) == trading_scenario()["account_info"]


def test_trading_get_order_details(trading):
    assert trading.execute(call("get_order_details", order_id=1002)) == trading_scenario()["orders"][1]


def test_trading_get_order_details_unknown_order(trading):
    response = trading.execute(call("get_order_details", order_id=9999))
    assert error_code(response) == "not_found"
    assert response["error"]["message"].startswith("Order with ID 9999 not found.")


def test_trading_cancel_pending_order(trading):
    assert trading.execute(call("cancel_order", order_id=1001)) == {"order_id": 1001, "status": "Cancelled"}
    assert trading.state()["orders"][1001]["status"] == "Cancelled"


def test_trading_cancel_completed_order_is_refused_and_state_unchanged(trading):
    before = trading.state()
    response = trading.execute(call("cancel_order", order_id=1002))
    assert error_code(response) == "already_completed"
    assert response["error"]["message"] == "Can't cancel order 1002. Order is already completed."
    assert trading.state() == before


def test_trading_cancel_unknown_order(trading):
    before = trading.state()
    assert error_code(trading.execute(call("cancel_order", order_id=9999))) == "not_found"
    assert trading.state() == before


def test_trading_place_order_creates_order_with_the_counter_id(trading):
    response = trading.execute(call("place_order", order_type="Buy", symbol="TSLA", price=200.0, amount=3))
    assert response == {"order_id": 1003, "order_type": "Buy", "status": "Pending", "price": 200.0, "amount": 3}
    state = trading.state()
    assert state["orders"][1003] == {
        "id": 1003, "order_type": "Buy", "symbol": "TSLA", "price": 200.0, "amount": 3, "status": "Open",
    }
    assert state["order_counter"] == 1004


def test_trading_place_order_insufficient_funds(trading):
    before = trading.state()
    response = trading.execute(call("place_order", order_type="Buy", symbol="TSLA", price=200.0, amount=6))
    assert error_code(response) == "insufficient_funds"
    assert response["error"]["message"].startswith("Insufficient funds")
    assert trading.state() == before


def test_trading_place_order_unknown_symbol(trading):
    before = trading.state()
    response = trading.execute(call("place_order", order_type="Buy", symbol="XXXX", price=1.0, amount=1))
    assert error_code(response) == "invalid_argument"
    assert trading.state() == before


def test_trading_place_order_requires_authentication():
    scenario = trading_scenario()
    scenario["authenticated"] = False
    b = backend("trading", scenario)
    response = b.execute(call("place_order", order_type="Buy", symbol="AAPL", price=100.0, amount=1))
    assert error_code(response) == "not_authenticated"


def test_trading_orders_are_keyed_by_int_id(trading):
    assert sorted(trading.state()["orders"]) == [1001, 1002]


def test_trading_state_excludes_private_attributes(trading):
    state = trading.state()
    assert not [k for k in state if k.startswith("_")]
    assert {"orders", "account_info", "authenticated", "market_status", "order_counter", "stocks",
            "watch_list", "transaction_history"} <= set(state)


def test_trading_state_is_a_snapshot(trading):
    before = trading.state()
    trading.execute(call("cancel_order", order_id=1001))
    assert before["orders"][1001]["status"] == "Pending"


def test_trading_backend_does_not_mutate_its_scenario():
    scenario = trading_scenario()
    b = backend("trading", scenario)
    b.execute(call("cancel_order", order_id=1001))
    b.execute(call("place_order", order_type="Buy", symbol="AAPL", price=100.0, amount=1))
    assert scenario == trading_scenario()


def test_trading_facts_of_place_order(trading):
    facts = trading.facts(call("place_order", order_type="Buy", symbol="AAPL", price=100.0, amount=1))
    assert facts == {"new_order": {"order_id": 1003}, "symbol_exists": True, "balance_covers_order": True}
    too_big = trading.facts(call("place_order", order_type="Buy", symbol="AAPL", price=100.0, amount=10**6))
    assert too_big["balance_covers_order"] is False


@pytest.mark.parametrize(
    "tool_call, expected",
    [
        (call("get_symbol_by_name", name="Apple"), {"symbol": "AAPL"}),
        (call("get_symbol_by_name", name="Nobody Inc"), {"symbol": "Stock not found"}),
        (call("get_stock_info", symbol="XXXX"), {"stock": None}),
        (call("get_stock_info", symbol="AAPL"), {"stock": trading_scenario()["stocks"]["AAPL"]}),
        (call("get_order_details", order_id=1002), {"order": trading_scenario()["orders"][1]}),
        (call("cancel_order", order_id=9999), {"order": None}),
        (call("get_account_info"), {"account_info": trading_scenario()["account_info"]}),
    ],
)
def test_trading_facts_of_read_calls(trading, tool_call, expected):
    assert trading.facts(tool_call) == expected


# --------------------------------------------------------------------------- the Backend.execute contract

# Per domain: a valid call of a tool with a required argument, and a wrong-typed value for one argument.
VALID_CALLS = {
    "bank": (call("transfer", from_account="A10", to_account="A20", amount=10), "amount", "10"),
    "files": (call("get_file_info", folder_id="D10", file_name="q1.pdf"), "folder_id", 10),
    "trading": (call("get_order_details", order_id=1001), "order_id", "1001"),
}


def bad_calls(domain_name):
    good, key, wrong_value = VALID_CALLS[domain_name]
    args = good["arguments"]
    missing = {k: v for k, v in args.items() if k != key}
    return {
        "not_a_dict": (["get_balance"], "invalid_call"),
        "none": (None, "invalid_call"),
        "no_name": ({"arguments": args}, "invalid_call"),
        "non_string_name": ({"name": 3, "arguments": args}, "invalid_call"),
        "unknown_tool": (call("launch_rockets"), "unknown_tool"),
        "missing_argument": ({"name": good["name"], "arguments": missing}, "invalid_arguments"),
        "no_arguments_key": ({"name": good["name"]}, "invalid_arguments"),
        "arguments_not_an_object": ({"name": good["name"], "arguments": [1, 2]}, "invalid_arguments"),
        "wrong_type": ({"name": good["name"], "arguments": {**args, key: wrong_value}}, "invalid_arguments"),
        "bool_for_wrong_type": ({"name": good["name"], "arguments": {**args, key: True}}, "invalid_arguments"),
        "extra_argument": ({"name": good["name"], "arguments": {**args, "force": True}}, "invalid_arguments"),
    }


CONTRACT_CASES = [
    pytest.param(d, case, id=f"{d}-{case}") for d in DOMAINS for case in bad_calls(d)
]


@pytest.mark.parametrize("domain_name", DOMAINS)
def test_execute_valid_call_succeeds(domain_name):
    good, _, _ = VALID_CALLS[domain_name]
    response = backend(domain_name).execute(good)
    assert isinstance(response, dict) and "error" not in response


@pytest.mark.parametrize("domain_name, case", CONTRACT_CASES)
def test_execute_bad_call_returns_error_object_and_leaves_state(domain_name, case):
    bad_call, code = bad_calls(domain_name)[case]
    b = backend(domain_name)
    before = snapshot(b)
    assert error_code(b.execute(bad_call)) == code
    assert b.state() == before


@pytest.mark.parametrize("domain_name", DOMAINS)
def test_execute_tool_not_offered_is_unknown(domain_name):
    good, _, _ = VALID_CALLS[domain_name]
    others = [t.name for t in get_domain(domain_name).tools if t.name != good["name"]]
    b = backend(domain_name)
    before = snapshot(b)
    assert error_code(b.execute(good, offered=others)) == "unknown_tool"
    assert error_code(b.execute(good, offered=[])) == "unknown_tool"
    assert b.state() == before


@pytest.mark.parametrize("domain_name", DOMAINS)
def test_execute_offered_tool_runs(domain_name):
    good, _, _ = VALID_CALLS[domain_name]
    assert "error" not in backend(domain_name).execute(good, offered=[good["name"]])


@pytest.mark.parametrize("domain_name", ["bank", "trading"])
def test_execute_rejects_string_for_integer(domain_name):
    good, key, wrong_value = VALID_CALLS[domain_name]
    assert isinstance(wrong_value, str)
    response = backend(domain_name).execute({"name": good["name"], "arguments": {**good["arguments"], key: wrong_value}})
    assert error_code(response) == "invalid_arguments"
    assert key in response["error"]["message"]


# --------------------------------------------------------------------------- tool schemas

SCHEMAS = [
    pytest.param(d, s, id=f"{d}-{s['function']['name']}") for d in DOMAINS for s in get_domain(d).schemas()
]


@pytest.mark.parametrize("domain_name, schema", SCHEMAS)
def test_tool_schema_has_openai_shape(domain_name, schema):
    assert set(schema) == {"type", "function", "risk", "preconditions"}
    assert schema["type"] == "function"
    fn = schema["function"]
    assert set(fn) == {"name", "description", "parameters"}
    assert isinstance(fn["name"], str) and fn["name"]
    assert isinstance(fn["description"], str) and fn["description"]
    assert fn["parameters"]["type"] == "object"
    assert set(fn["parameters"]["required"]) <= set(fn["parameters"]["properties"])
    assert fn["parameters"]["additionalProperties"] is False
    assert schema["risk"] in ("low", "high")
    assert isinstance(schema["preconditions"], list)


@pytest.mark.parametrize("domain_name, schema", SCHEMAS)
def test_high_risk_tools_declare_preconditions(domain_name, schema):
    if schema["risk"] == "high":
        assert schema["preconditions"] and all(isinstance(p, str) and p for p in schema["preconditions"])


@pytest.mark.parametrize(
    "domain_name, high_risk",
    [("bank", {"transfer"}), ("files", {"delete_file", "delete_folder"}), ("trading", {"place_order", "cancel_order"})],
)
def test_domain_high_risk_tools(domain_name, high_risk):
    assert {t.name for t in get_domain(domain_name).tools if t.risk == "high"} == high_risk


@pytest.mark.parametrize("domain_name", DOMAINS)
def test_tool_names_are_unique_and_dispatchable(domain_name):
    domain = get_domain(domain_name)
    names = [t.name for t in domain.tools]
    assert len(names) == len(set(names))
    if domain_name != "trading":  # trading dispatches to the BFCL bot instead of tool_<name>
        assert all(callable(getattr(domain.backend, f"tool_{n}", None)) for n in names)


def test_high_risk_tool_without_preconditions_is_rejected():
    with pytest.raises(ValueError, match="preconditions"):
        Tool("wipe", "Wipe everything.", params({}), risk="high")


def test_tool_schema_carries_risk_and_preconditions():
    tool = Tool("wipe", "Wipe everything.", params({"id": {"type": "string"}}), risk="high", preconditions=("asked twice",))
    assert tool.schema() == {
        "type": "function",
        "function": {
            "name": "wipe", "description": "Wipe everything.",
            "parameters": {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"],
                           "additionalProperties": False},
        },
        "risk": "high",
        "preconditions": ["asked twice"],
    }


# --------------------------------------------------------------------------- Domain.replay

STATE_CHANGING = {
    "bank": {"transfer"},
    "files": {"delete_file", "delete_empty_folder"},
    "trading": {"buy_stock", "cancel_order"},
}
READ_ONLY = {
    "bank": {"balance_inquiry", "transfer_insufficient"},
    "files": {"file_size", "file_exists", "delete_nonempty_folder"},
    "trading": {"order_status", "cancel_completed", "account_balance"},
}


@pytest.fixture(scope="module")
def generated_tasks():
    return {d: generate_tasks(get_domain(d), 5, seed=0) for d in DOMAINS}


@pytest.mark.parametrize("domain_name", DOMAINS)
def test_task_type_classification_covers_the_domain(domain_name):
    assert STATE_CHANGING[domain_name] | READ_ONLY[domain_name] == set(get_domain(domain_name).task_types)


@pytest.mark.parametrize("domain_name", DOMAINS)
def test_replay_changes_state_only_for_state_changing_tasks(generated_tasks, domain_name):
    domain = get_domain(domain_name)
    tasks = generated_tasks[domain_name]
    assert {t.task_type for t in tasks} & STATE_CHANGING[domain_name]
    assert {t.task_type for t in tasks} & READ_ONLY[domain_name]
    for task in tasks:
        assert task.checklist.ground_truth, task.id
        initial = domain.backend(task.scenario).state()
        replayed = domain.replay(task).state()
        if task.task_type in STATE_CHANGING[domain_name]:
            assert replayed != initial, task.id
        else:
            assert replayed == initial, task.id


def test_bank_replay_of_transfer_moves_the_task_amount(generated_tasks):
    task = next(t for t in generated_tasks["bank"] if t.task_type == "transfer")
    (transfer,) = task.checklist.required_calls
    args = transfer["arguments"]
    start = {a["account_id"]: a["balance"] for a in task.scenario["accounts"]}
    end = balances(get_domain("bank").replay(task))
    assert end[args["from_account"]] == start[args["from_account"]] - args["amount"]
    assert end[args["to_account"]] == start[args["to_account"]] + args["amount"]


def test_replay_does_not_mutate_the_task_scenario(generated_tasks):
    for domain_name in DOMAINS:
        for task in generated_tasks[domain_name]:
            scenario = copy.deepcopy(task.scenario)
            get_domain(domain_name).replay(task)
            assert task.scenario == scenario, task.id


def test_float_and_bool_are_not_integers():
    b = get_domain("bank").backend({"accounts": [
        {"account_id": "A1", "owner": "X", "balance": 50}, {"account_id": "A2", "owner": "Y", "balance": 5}]})
    for amount in (10.0, True):
        reply = b.execute({"name": "transfer", "arguments": {"from_account": "A1", "to_account": "A2", "amount": amount}})
        assert reply["error"]["code"] == "invalid_arguments"
    assert [a["balance"] for a in b.state()["accounts"]] == [50, 5]


@pytest.mark.parametrize("name", ["bank", "files", "trading"])
def test_state_is_a_snapshot_not_a_live_view(name):
    domain = get_domain(name)
    task = next(t for t in generate_tasks(domain, 10, seed=0) if t.task_type in ("transfer", "delete_file", "cancel_order"))
    backend = domain.backend(task.scenario)
    before = backend.state()
    for turn in task.checklist.ground_truth:
        for c in turn:
            backend.execute(c)
    assert backend.state() != before


def test_trading_nonpositive_amount_has_a_specific_code():
    task = next(t for t in generate_tasks(get_domain("trading"), 5, seed=0) if t.task_type == "buy_stock")
    backend = get_domain("trading").backend(task.scenario)
    symbol = next(iter(task.scenario["stocks"]))
    reply = backend.execute({"name": "place_order", "arguments": {"order_type": "Buy", "symbol": symbol, "price": 10.5, "amount": 0}})
    assert reply["error"] == {"code": "invalid_argument", "message": "Price and amount must be positive values."}


@pytest.mark.parametrize("name", [d for d in DOMAINS if get_domain(d).interchangeable])
def test_renaming_interchangeable_names_keeps_episodes_valid(name, prepared_dir):
    """What warmup's relabelling relies on: rename the names of an episode consistently and
    the real backend gives exactly the renamed responses."""
    import json
    import random
    import re

    from envace.io import read_jsonl
    from envace.data.episodes import recorded_calls

    domain = get_domain(name)
    rng = random.Random(0)
    episodes = [e for e in read_jsonl(prepared_dir / "data/prepared/train.jsonl") if e["task"]["domain"] == name]
    assert episodes
    for episode in episodes[:40]:
        mapping = {}
        for cls in domain.interchangeable:
            mapping.update(zip(cls, rng.sample(cls, len(cls))))
        word = re.compile(r"(?<![A-Za-z0-9_.$-])[A-Za-z0-9_]+(?:[.\-][A-Za-z0-9_]+)*(?![A-Za-z0-9_-])")
        renamed = json.loads(word.sub(lambda m: mapping.get(m.group(0), m.group(0)), json.dumps(episode)))
        backend = domain.backend(renamed["task"]["scenario"])
        for call, response in recorded_calls(renamed):
            assert backend.execute(call, [t["function"]["name"] for t in renamed["task"]["tools"]]) == response
