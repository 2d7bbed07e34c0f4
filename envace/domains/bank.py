"""bank — our own domain: find accounts, check balances, transfer money.

Hidden state: a table of 4–6 accounts (id, owner, balance). Later arguments depend on
earlier responses (account ids come from `find_account`). `transfer` is irreversible and
requires the balance to cover the amount; in `transfer_insufficient` tasks the right move
is to check and refuse. The demonstrator's most frequent behaviour there is wrong: it
usually transfers without checking (rate `skip_check_rate`).
"""

from __future__ import annotations

import copy
import random

from envace.domains.base import (
    INT, STR, Backend, Checklist, Domain, Mistakes, Precondition, Script, Task, Tool, ToolError, call, is_error,
    params,
)

OWNERS = (
    "Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Karl Laura Mallory Nina Oscar Peggy Quinn "
    "Rupert Sybil Trent Ursula Victor Wendy Xavier Yvonne Zack Amir Bella Chen Dana Elif Farah Gita "
    "Hugo Ines Jonas Kenji Lena Marco Noor Omar Priya Rosa Sven Tara Umar Vera Wu Yara Zoe"
).split()
ACCOUNT_IDS = [f"A{i}" for i in range(10, 100)]
AMOUNTS = list(range(10, 310, 10))
BALANCES = list(range(0, 510, 10))
MONTHS = "January February March April May June July August September October November December".split()

TOOLS = (
    Tool("find_account", "Find the account id of a customer by owner name.", params({"owner": STR})),
    Tool("get_balance", "Get the current balance of an account.", params({"account_id": STR})),
    Tool(
        "transfer",
        "Transfer money between two accounts. Irreversible.",
        params({"from_account": STR, "to_account": STR, "amount": INT}),
        risk="high",
        preconditions=(
            Precondition("the balance of from_account is at least amount", "balance", ">=", "$amount",
                         evidence={"tool": "get_balance", "arguments": {"account_id": "$from_account"}}),
            Precondition("amount is positive", "amount", ">", 0),
        ),
    ),
)


class BankBackend(Backend):
    tools = TOOLS

    def __init__(self, scenario: dict):
        super().__init__(scenario)
        self.accounts = {a["account_id"]: dict(a) for a in self.scenario["accounts"]}

    def _account(self, account_id: str) -> dict:
        if account_id not in self.accounts:
            raise ToolError("unknown_account", "no such account")
        return self.accounts[account_id]

    def tool_find_account(self, owner: str):
        for acc in self.accounts.values():
            if acc["owner"] == owner:
                return {"account_id": acc["account_id"]}
        raise ToolError("not_found", "no account for this owner")

    def tool_get_balance(self, account_id: str):
        return {"account_id": account_id, "balance": self._account(account_id)["balance"]}

    def tool_transfer(self, from_account: str, to_account: str, amount: int):
        src, dst = self._account(from_account), self._account(to_account)
        if amount <= 0:
            raise ToolError("invalid_amount", "amount must be positive")
        if from_account == to_account:
            raise ToolError("same_account", "cannot transfer to the same account")
        if src["balance"] < amount:
            raise ToolError("insufficient_funds", "balance too low")
        src["balance"] -= amount
        dst["balance"] += amount
        return {"status": "completed", "amount": amount}

    def state(self) -> dict:
        return copy.deepcopy({"accounts": sorted(self.accounts.values(), key=lambda a: a["account_id"])})

    def facts(self, call: dict) -> dict:
        """The accounts the call names; for a transfer also whether the balance covers it."""
        args = call.get("arguments") or {}
        values = set(map(str, args.values()))
        rows = [a for a in self.accounts.values() if a["account_id"] in values or a["owner"] in values]
        facts: dict = {"accounts": copy.deepcopy(rows)}
        if call.get("name") == "transfer" and args.get("from_account") in self.accounts:
            amount = args.get("amount")
            facts["balance_covers_amount"] = isinstance(amount, int) and self.accounts[args["from_account"]]["balance"] >= amount
        return facts


REQUESTS = {
    "balance_inquiry": (
        "What is the balance of {owner}'s account for the {month} statement?",
        "For the {month} report, how much money does {owner} have?",
        "Check {owner}'s balance for {month}, please.",
        "I am closing the books for {month}. Tell me the current balance on {owner}'s account.",
    ),
    "transfer": (
        "Send {amount} from {sender} to {recipient}.",
        "Transfer {amount} from {sender}'s account to {recipient}'s account.",
        "Please move {amount} from {sender} to {recipient}.",
        "Pay {recipient} {amount} out of {sender}'s account.",
    ),
}
REQUESTS["transfer_insufficient"] = REQUESTS["transfer"]  # same words: only the state differs
TASK_TYPES = ("balance_inquiry", "transfer", "transfer_insufficient")


def make_task(rng: random.Random, task_type: str, task_id: str) -> Task:
    owners = rng.sample(OWNERS, rng.randint(4, 6))
    ids = rng.sample(ACCOUNT_IDS, len(owners))
    accounts = [{"account_id": i, "owner": o, "balance": rng.choice(BALANCES)} for i, o in zip(ids, owners)]
    sender, recipient = accounts[0], accounts[1]
    rng.shuffle(accounts)
    slots = {"month": rng.choice(MONTHS)}
    if task_type == "balance_inquiry":
        slots["owner"] = sender["owner"]
        checklist = Checklist(
            required_calls=[call("get_balance", account_id=sender["account_id"])],
            final_answer=[str(sender["balance"])],
        )
    else:
        amount = rng.choice(AMOUNTS)
        if task_type == "transfer":
            sender["balance"] = max(sender["balance"], amount + rng.choice(BALANCES[:20]))
            sender["balance"] = min(sender["balance"], BALANCES[-1])
            transfer = call("transfer", from_account=sender["account_id"], to_account=recipient["account_id"], amount=amount)
            checklist = Checklist(required_calls=[transfer], final_answer=["sent", str(amount)])
        else:
            sender["balance"] = rng.choice([b for b in BALANCES if b < amount])
            checklist = Checklist(
                required_calls=[call("get_balance", account_id=sender["account_id"])],
                forbidden_calls=[{"name": "transfer"}],
                final_answer=["cannot"],
            )
        slots.update(sender=sender["owner"], recipient=recipient["owner"], amount=amount)
    request = rng.choice(REQUESTS[task_type]).format(**slots)
    return Task(task_id, "bank", task_type, request, [t.schema() for t in TOOLS], {"accounts": accounts}, checklist, slots)


def demonstrate(task: Task, mistakes: Mistakes) -> Script:
    s = task.slots
    if task.task_type == "balance_inquiry":
        (found,) = yield [call("find_account", owner=s["owner"])]
        (bal,) = yield [call("get_balance", account_id=found["account_id"])]
        return f"The balance is {bal['balance']}."
    src, dst = yield [call("find_account", owner=s["sender"]), call("find_account", owner=s["recipient"])]
    if not mistakes.skip_check:
        (bal,) = yield [call("get_balance", account_id=src["account_id"])]
        if bal["balance"] < s["amount"]:
            return "Cannot send: the balance is too low."
    (done,) = yield [call("transfer", from_account=src["account_id"], to_account=dst["account_id"], amount=s["amount"])]
    if is_error(done):
        return f"Failed: {done['error']['code']}."
    return f"Sent {s['amount']}."


DOMAIN = Domain("bank", BankBackend, TASK_TYPES, make_task, demonstrate,
                interchangeable=(tuple(OWNERS), tuple(ACCOUNT_IDS)))
