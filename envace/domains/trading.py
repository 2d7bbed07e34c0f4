"""trading — a domain backed by the BFCL multi-turn `TradingBot` backend (bfcl-eval wheel).

The backend is BFCL's own deterministic Python class; what is ours: the tool schemas
(converted from BFCL's function docs, plus risk levels), a safe executor (dispatch by name
over the offered tools after JSON-schema validation — never `eval`, no global instances),
a templated task generator, and success judged BFCL's way: the backend's state after the
episode must equal its state after replaying the ground truth.
`place_order` and `cancel_order` are irreversible. `account_balance` tasks exist so that
`get_account_info` (otherwise called only by a careful buyer) has enough held-out calls to be
gated. In `cancel_completed` tasks the right
move is to look the order up and refuse; the demonstrator usually cancels blindly.
"""

from __future__ import annotations

import copy
import json
import random
import re
from functools import cache
from importlib import resources

from envace.domains.base import (
    Backend, Checklist, Domain, Mistakes, Precondition, Script, Task, Tool, call, error_response, is_error,
)

OFFERED = ("get_symbol_by_name", "get_stock_info", "get_account_info", "get_order_details", "place_order", "cancel_order")
RISK = {
    "place_order": (
        Precondition("the account balance covers price * amount for a Buy", "balance", ">=", ["$price", "$amount"],
                     evidence={"tool": "get_account_info", "arguments": {}}, when={"order_type": "Buy"}),
        Precondition("the stock symbol exists"),
    ),
    "cancel_order": (
        Precondition("the order exists and is not Completed", "status", "!=", "Completed",
                     evidence={"tool": "get_order_details", "arguments": {"order_id": "$order_id"}}),
    ),
}
# Company names BFCL's get_symbol_by_name knows (its map is fixed in the backend).
COMPANIES = {
    "Apple": "AAPL", "Google": "GOOG", "Tesla": "TSLA", "Microsoft": "MSFT", "Nvidia": "NVDA",
    "Zeta Corp": "ZETA", "Alpha Tech": "ALPH", "Omega Industries": "OMEG", "Quasar Ltd.": "QUAS",
    "Neptune Systems": "NEPT", "Synex Solutions": "SYNX", "Amazon": "AMZN",
}
_POOL = random.Random(2608)  # fixed value pools keep the vocabulary closed
PRICES = sorted({round(_POOL.uniform(20, 900), 2) for _ in range(60)})
CHANGES = sorted({round(_POOL.uniform(-3, 3), 2) for _ in range(30)})
VOLUMES = sorted({round(_POOL.uniform(0.5, 9), 3) for _ in range(30)})
ORDER_IDS = list(range(1000, 1400))
ACCOUNT_IDS = list(range(20001, 20061))
CARD_NUMBERS = sorted({_POOL.randrange(10**15, 10**16) for _ in range(40)})
STATUSES = ("Open", "Pending", "Completed", "Cancelled")
# BFCL reports errors as {"error": "<sentence>"}; we keep the sentence and add a code.
ERROR_CODES = (
    ("Insufficient funds", "insufficient_funds"), ("Can't cancel", "already_completed"),
    ("not found", "not_found"), ("not authenticated", "not_authenticated"), ("Invalid", "invalid_argument"),
    ("must be positive", "invalid_argument"),
)


def _bfcl_type(spec: dict) -> dict:
    """BFCL's doc dialect ("dict", "float", "tuple", "any") → JSON schema."""
    kind = {"dict": "object", "float": "number", "tuple": "array", "any": None}.get(spec.get("type"), spec.get("type"))
    out = {"type": kind} if kind else {}
    if "properties" in spec:
        out["properties"] = {k: _bfcl_type(v) for k, v in spec["properties"].items()}
        out["required"] = list(spec.get("required", []))
        out["additionalProperties"] = False
    if "items" in spec:
        out["items"] = _bfcl_type(spec["items"])
    if "enum" in spec:
        out["enum"] = spec["enum"]
    return out


@cache
def _tools() -> tuple[Tool, ...]:
    docs = resources.files("bfcl_eval").joinpath("data/multi_turn_func_doc/trading_bot.json").read_text()
    by_name = {d["name"]: d for d in map(json.loads, docs.splitlines())}
    tools = []
    for name in OFFERED:
        doc = by_name[name]
        description = doc["description"].split("Tool description: ")[-1]
        risk = "high" if name in RISK else "low"
        tools.append(Tool(name, description, _bfcl_type(doc["parameters"]), risk, RISK.get(name, ())))
    return tuple(tools)


class _ToolsDescriptor:
    def __get__(self, obj, owner):
        return _tools()


class TradingBackend(Backend):
    tools = _ToolsDescriptor()  # loaded lazily from the wheel's docs

    def __init__(self, scenario: dict):
        from bfcl_eval.eval_checker.multi_turn_eval.func_source_code.trading_bot import TradingBot

        super().__init__(scenario)
        config = copy.deepcopy(self.scenario)
        config["orders"] = {o["id"]: o for o in config["orders"]}  # JSON has no int keys
        self.bot = TradingBot()
        self.bot._load_scenario(config)

    def dispatch(self, name: str, args: dict):
        response = getattr(self.bot, name)(**args)  # name is one of the offered tools (checked)
        if isinstance(response.get("error"), str):
            msg = response["error"]
            code = next((c for key, c in ERROR_CODES if key in msg), "failed")
            return error_response(code, msg)
        return copy.deepcopy(response)

    def state(self) -> dict:
        return {k: copy.deepcopy(v) for k, v in vars(self.bot).items() if not k.startswith("_")}

    def facts(self, call: dict) -> dict:
        """Only what the call touches (a stock, an order, the account), plus, for a new order,
        the id it would get (under the response's own key) and whether the balance covers it."""
        args, bot, name = call.get("arguments") or {}, self.bot, call.get("name")
        facts: dict = {}
        if name == "get_symbol_by_name":
            facts["symbol"] = COMPANIES.get(args.get("name"), "Stock not found")
        elif name == "get_stock_info":
            facts["stock"] = bot.stocks.get(args.get("symbol"))
        elif name in ("get_order_details", "cancel_order"):
            facts["order"] = bot.orders.get(args.get("order_id"))
        elif name == "get_account_info":
            facts["account_info"] = bot.account_info
        elif name == "place_order":
            price, amount = args.get("price"), args.get("amount")
            facts["new_order"] = {"order_id": bot.order_counter}
            facts["symbol_exists"] = args.get("symbol") in bot.stocks
            facts["balance_covers_order"] = (isinstance(price, (int, float)) and isinstance(amount, int)
                                             and price * amount <= bot.account_info["balance"])
        return copy.deepcopy(facts)


REQUESTS = {
    "buy_stock": (
        "Buy {amount} shares of {company} at the current market price.",
        "Place a buy order for {amount} {company} shares at today's price.",
        "I want {amount} shares of {company}; buy them at the current price.",
    ),
    "order_status": (
        "What is the status of order {order_id}?",
        "Can you check on my order {order_id}?",
        "Has order {order_id} gone through yet?",
    ),
    "account_balance": (
        "What is the balance of my trading account? I am weighing {amount} shares of {company}.",
        "How much cash is there in my trading account? I might buy {amount} {company} shares later.",
        "Before I think about {amount} shares of {company}, check my trading account's balance.",
    ),
    "cancel_order": (
        "Cancel order {order_id}.",
        "Please cancel my order {order_id}.",
        "I changed my mind about order {order_id}; cancel it.",
        "Call off order {order_id}, please.",
    ),
}
REQUESTS["cancel_completed"] = REQUESTS["cancel_order"]
TASK_TYPES = tuple(REQUESTS)


def _stock(rng: random.Random) -> dict:
    price = rng.choice(PRICES)
    return {"price": price, "percent_change": rng.choice(CHANGES), "volume": rng.choice(VOLUMES),
            "MA(5)": rng.choice(PRICES), "MA(20)": rng.choice(PRICES)}


def make_task(rng: random.Random, task_type: str, task_id: str) -> Task:
    companies = rng.sample(sorted(COMPANIES), rng.randint(4, 7))
    stocks = {COMPANIES[c]: _stock(rng) for c in companies}
    order_ids = sorted(rng.sample(ORDER_IDS, rng.randint(2, 5)))
    orders = [
        {"id": i, "order_type": rng.choice(("Buy", "Sell")), "symbol": rng.choice(sorted(stocks)),
         "price": rng.choice(PRICES), "amount": rng.randint(1, 20), "status": rng.choice(STATUSES)}
        for i in order_ids
    ]
    scenario = {
        "account_info": {"account_id": rng.choice(ACCOUNT_IDS), "balance": float(rng.randrange(20000, 60000, 500)),
                         "binding_card": rng.choice(CARD_NUMBERS)},
        "authenticated": True, "market_status": "Open", "order_counter": order_ids[-1] + 1,
        "orders": orders, "stocks": stocks, "watch_list": [], "transaction_history": [],
    }
    slots: dict = {}
    if task_type == "buy_stock":
        company = companies[0]
        symbol = COMPANIES[company]
        slots = {"company": company, "amount": rng.randint(1, 20)}
        order = call("place_order", order_type="Buy", symbol=symbol, price=stocks[symbol]["price"], amount=slots["amount"])
        checklist = Checklist([call("get_stock_info", symbol=symbol), order], final_answer=[str(scenario["order_counter"])])
    elif task_type == "account_balance":  # the shares only make the request concrete: nothing is bought
        slots = {"company": companies[0], "amount": rng.randint(1, 20)}
        checklist = Checklist([call("get_account_info")], final_answer=[str(scenario["account_info"]["balance"])])
    else:
        order = rng.choice(orders)
        slots = {"order_id": order["id"]}
        if task_type == "order_status":
            checklist = Checklist([call("get_order_details", order_id=order["id"])], final_answer=[order["status"]])
        elif task_type == "cancel_order":
            order["status"] = rng.choice(("Open", "Pending"))
            checklist = Checklist([call("cancel_order", order_id=order["id"])], final_answer=["cancelled"])
        else:
            order["status"] = "Completed"
            checklist = Checklist([call("get_order_details", order_id=order["id"])],
                                  forbidden_calls=[{"name": "cancel_order"}], final_answer=["cannot"])
    request = rng.choice(REQUESTS[task_type]).format(**slots)
    return Task(task_id, "trading", task_type, request, [t.schema() for t in _tools()], scenario, checklist, slots)


def demonstrate(task: Task, mistakes: Mistakes) -> Script:
    s = task.slots
    if task.task_type == "buy_stock":
        (found,) = yield [call("get_symbol_by_name", name=s["company"])]
        symbol = found["symbol"]
        if mistakes.skip_check:
            (info,) = yield [call("get_stock_info", symbol=symbol)]
        else:
            info, account = yield [call("get_stock_info", symbol=symbol), call("get_account_info")]
            if account["balance"] < info["price"] * s["amount"]:
                return "Cannot buy: the balance is too low."
        (order,) = yield [call("place_order", order_type="Buy", symbol=symbol, price=info["price"], amount=s["amount"])]
        return f"Placed order {order['order_id']}."
    if task.task_type == "account_balance":
        (account,) = yield [call("get_account_info")]
        return f"The balance is {account['balance']}."
    order_id = s["order_id"]
    if task.task_type == "order_status" or not mistakes.skip_check:
        (details,) = yield [call("get_order_details", order_id=order_id)]
        if task.task_type == "order_status":
            return f"The status is {details['status']}."
        if details["status"] == "Completed":
            return "Cannot cancel: the order is completed."
    (done,) = yield [call("cancel_order", order_id=order_id)]
    if is_error(done):
        return f"Failed: {done['error']['code']}."
    return "Cancelled."


# Order ids are only compared for equality (one order per episode, so the counter's +1
# never matters); symbols are not interchangeable: BFCL's name -> symbol map is fixed.
DOMAIN = Domain("trading", TradingBackend, TASK_TYPES, make_task, demonstrate,
                interchangeable=(tuple(str(i) for i in ORDER_IDS),))
