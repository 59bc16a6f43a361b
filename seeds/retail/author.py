"""Author the retail seed trajectories (seeds.jsonl) from a small hand-written store.

Why a script: every observation in a seed must be exactly what the tool returns on the
store's data, and a write must change what later reads show. The store below (products,
users, orders) is invented for these seeds; each call is executed by a small executor
with tau-bench's retail semantics on a fresh copy of it, so the seeds are self-consistent.
Run from the repository root: ``python seeds/retail/author.py`` (rewrites seeds.jsonl).
"""

from __future__ import annotations

import json
from copy import deepcopy
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def variant(item_id: str, price: float, available: bool = True, **options: str) -> dict[str, Any]:
    return {"item_id": item_id, "options": options, "available": available, "price": price}


PRODUCTS: dict[str, dict[str, Any]] = {}


def product(name: str, product_id: str, *variants: dict[str, Any]) -> None:
    PRODUCTS[product_id] = {
        "name": name,
        "product_id": product_id,
        "variants": {v["item_id"]: v for v in variants},
    }


product("T-Shirt", "4173920658",
        variant("7350218846", 24.5, color="navy", size="M", material="cotton", style="crew neck"),
        variant("2918473650", 24.5, color="navy", size="L", material="cotton", style="crew neck"),
        variant("5583027714", 27.25, color="white", size="M", material="organic cotton", style="v-neck"),
        variant("8830461297", 22.0, False, color="red", size="S", material="polyester", style="crew neck"))
product("Running Shoes", "6602814735",
        variant("3305917428", 89.99, size="9", color="black", material="mesh", sole="foam"),
        variant("1148290376", 94.5, size="10", color="black", material="mesh", sole="foam"),
        variant("9021746683", 92.0, size="10", color="grey", material="knit", sole="rubber"),
        variant("4470385219", 87.75, False, size="11", color="blue", material="mesh", sole="foam"))
product("Wireless Earbuds", "2258093471",
        variant("6614820937", 129.0, color="black", battery_life="6 hours", water_resistance="IPX4"),
        variant("3027751846", 149.0, color="white", battery_life="8 hours", water_resistance="IPX7"),
        variant("8190362254", 139.5, False, color="blue", battery_life="8 hours", water_resistance="IPX4"))
product("Desk Lamp", "9385160274",
        variant("2704918365", 45.99, color="black", brightness="medium", power_source="AC adapter"),
        variant("5162093847", 52.49, color="silver", brightness="high", power_source="USB"),
        variant("7739215048", 39.0, color="white", brightness="low", power_source="battery"))
product("Coffee Maker", "5031798426",
        variant("1883064725", 74.95, color="black", capacity="8 cups", type="drip", features="timer"),
        variant("6407219583", 81.3, color="stainless steel", capacity="8 cups", type="drip", features="built-in grinder"),
        variant("3951826047", 68.4, color="red", capacity="4 cups", type="french press", features="none"))
product("Backpack", "7418250963",
        variant("9264038175", 59.0, color="green", size="medium", material="nylon", compartment="laptop"),
        variant("4058173926", 64.5, color="black", size="large", material="nylon", compartment="laptop"),
        variant("2617405839", 55.25, color="grey", size="small", material="polyester", compartment="hydration"))
product("Water Bottle", "3840672915",
        variant("8502614937", 18.99, capacity="500ml", material="stainless steel", color="blue"),
        variant("1396027458", 21.49, capacity="750ml", material="stainless steel", color="black"),
        variant("6748193025", 14.5, capacity="1000ml", material="plastic", color="green"))
product("Mechanical Keyboard", "1507394826",
        variant("5829471036", 119.99, switch_type="tactile", backlight="RGB", size="full size"),
        variant("2360918574", 109.0, switch_type="linear", backlight="white", size="80%"),
        variant("7015283649", 124.5, False, switch_type="clicky", backlight="RGB", size="full size"))


def item(item_id: str) -> dict[str, Any]:
    for p in PRODUCTS.values():
        if item_id in p["variants"]:
            v = p["variants"][item_id]
            return {"name": p["name"], "product_id": p["product_id"], "item_id": item_id,
                    "price": v["price"], "options": dict(v["options"])}
    raise KeyError(item_id)


def address(a1: str, a2: str, city: str, state: str, zip_: str) -> dict[str, str]:
    return {"address1": a1, "address2": a2, "city": city, "country": "USA", "state": state,
            "zip": zip_}


USERS: dict[str, dict[str, Any]] = {}
ORDERS: dict[str, dict[str, Any]] = {}


def user(uid: str, first: str, last: str, addr: dict[str, str], email: str,
         methods: list[dict[str, Any]]) -> None:
    USERS[uid] = {"name": {"first_name": first, "last_name": last}, "address": addr,
                  "email": email, "payment_methods": {m["id"]: m for m in methods}, "orders": []}


def card(n: str, brand: str, last4: str) -> dict[str, Any]:
    return {"source": "credit_card", "brand": brand, "last_four": last4, "id": f"credit_card_{n}"}


def gift(n: str, balance: float) -> dict[str, Any]:
    return {"source": "gift_card", "balance": balance, "id": f"gift_card_{n}"}


def paypal(n: str) -> dict[str, Any]:
    return {"source": "paypal", "id": f"paypal_{n}"}


def order(oid: str, uid: str, status: str, items: list[str], method: str,
          tracking: str | None = None) -> None:
    its = [item(i) for i in items]
    total = round(sum(i["price"] for i in its), 2)
    fulfil = ([{"tracking_id": [tracking], "item_ids": list(items)}]
              if tracking and status not in ("pending", "cancelled") else [])
    history = [{"transaction_type": "payment", "amount": total, "payment_method_id": method}]
    if status == "cancelled":
        history.append({"transaction_type": "refund", "amount": total, "payment_method_id": method})
    ORDERS[oid] = {"order_id": oid, "user_id": uid, "address": deepcopy(USERS[uid]["address"]),
                   "items": its, "fulfillments": fulfil, "status": status,
                   "payment_history": history}
    if status == "cancelled":
        ORDERS[oid]["cancel_reason"] = "no longer needed"
    USERS[uid]["orders"].append(oid)


user("mia_ortiz_4821", "Mia", "Ortiz", address("412 Maple Avenue", "Apt 3B", "Columbus", "OH", "43215"),
     "mia.ortiz4821@example.com", [card("3917264", "visa", "7731"), gift("4832716", 120.0)])
order("#W2378156", "mia_ortiz_4821", "pending", ["7350218846", "1883064725"], "credit_card_3917264")
order("#W5193047", "mia_ortiz_4821", "delivered", ["3305917428"], "credit_card_3917264", "681294035712")
order("#W8402615", "mia_ortiz_4821", "processed", ["2704918365"], "gift_card_4832716", "447120938561")

user("noah_kim_7305", "Noah", "Kim", address("88 Harbor Street", "", "Portland", "ME", "04101"),
     "noah.kim7305@example.com", [paypal("6208413"), gift("1175930", 35.5)])
order("#W6620184", "noah_kim_7305", "pending", ["6614820937"], "paypal_6208413")
order("#W3049781", "noah_kim_7305", "delivered", ["9264038175", "8502614937"], "paypal_6208413", "902736158440")

user("sofia_reyes_2290", "Sofia", "Reyes", address("17 Cedar Lane", "Suite 210", "Austin", "TX", "78701"),
     "sofia.reyes2290@example.com", [card("8254017", "mastercard", "1904"), gift("6093381", 250.0)])
order("#W7719302", "sofia_reyes_2290", "pending", ["5829471036", "1396027458"], "credit_card_8254017")
order("#W1284096", "sofia_reyes_2290", "delivered", ["5583027714", "5583027714", "2617405839"], "credit_card_8254017", "315908247761")
order("#W9035517", "sofia_reyes_2290", "pending (item modified)", ["3027751846"], "gift_card_6093381")

user("liam_chen_5518", "Liam", "Chen", address("930 Birch Road", "", "Denver", "CO", "80203"),
     "liam.chen5518@example.com", [card("5402298", "amex", "3008"), paypal("9170264")])
order("#W4471930", "liam_chen_5518", "delivered", ["1148290376", "6748193025"], "paypal_9170264", "528340917762")
order("#W2950638", "liam_chen_5518", "pending", ["7739215048", "2918473650"], "credit_card_5402298")
order("#W6183204", "liam_chen_5518", "cancelled", ["3951826047"], "credit_card_5402298")

user("ava_patel_6634", "Ava", "Patel", address("2201 Lakeshore Drive", "Unit 5", "Chicago", "IL", "60614"),
     "ava.patel6634@example.com", [gift("2837465", 40.0), card("7718290", "visa", "5522")])
order("#W8861427", "ava_patel_6634", "pending", ["4058173926"], "credit_card_7718290")
order("#W3307152", "ava_patel_6634", "delivered", ["1883064725", "2360918574"], "credit_card_7718290", "660281734955")

user("ethan_brooks_1042", "Ethan", "Brooks", address("55 Willow Court", "", "Raleigh", "NC", "27601"),
     "ethan.brooks1042@example.com", [paypal("3384910")])
order("#W5548023", "ethan_brooks_1042", "processed", ["6407219583"], "paypal_3384910", "774019263558")
order("#W1960374", "ethan_brooks_1042", "delivered", ["9021746683"], "paypal_3384910", "209485716330")

user("zoe_nguyen_8817", "Zoe", "Nguyen", address("740 Sunset Boulevard", "Apt 12", "San Diego", "CA", "92101"),
     "zoe.nguyen8817@example.com", [card("2650471", "discover", "6618"), gift("9402816", 15.0)])
order("#W7302849", "zoe_nguyen_8817", "pending", ["5162093847", "8502614937"], "credit_card_2650471")
order("#W4016728", "zoe_nguyen_8817", "exchange requested", ["3305917428"], "credit_card_2650471", "118530274693")


# ----------------------------------------------------------------------------------------
# The executor: tau-bench's retail tool semantics on a copy of the store
# ----------------------------------------------------------------------------------------
class Store:
    def __init__(self) -> None:
        self.users, self.orders, self.products = deepcopy(USERS), deepcopy(ORDERS), deepcopy(PRODUCTS)

    def run(self, name: str, a: dict[str, Any]) -> str:
        return getattr(self, name)(**a)

    def calculate(self, expression: str) -> str:
        if not all(c in "0123456789+-*/(). " for c in expression):
            return "Error: invalid characters in expression"
        return str(round(float(eval(expression, {"__builtins__": None}, {})), 2))  # noqa: S307

    def think(self, thought: str) -> str:
        return ""

    def transfer_to_human_agents(self, summary: str) -> str:
        return "Transfer successful"

    def find_user_id_by_email(self, email: str) -> str:
        for uid, u in self.users.items():
            if u["email"].lower() == email.lower():
                return uid
        return "Error: user not found"

    def find_user_id_by_name_zip(self, first_name: str, last_name: str, zip: str) -> str:
        for uid, u in self.users.items():
            if (u["name"]["first_name"].lower() == first_name.lower()
                    and u["name"]["last_name"].lower() == last_name.lower()
                    and u["address"]["zip"] == zip):
                return uid
        return "Error: user not found"

    def get_user_details(self, user_id: str) -> str:
        return json.dumps(self.users[user_id]) if user_id in self.users else "Error: user not found"

    def get_order_details(self, order_id: str) -> str:
        return json.dumps(self.orders[order_id]) if order_id in self.orders else "Error: order not found"

    def get_product_details(self, product_id: str) -> str:
        if product_id not in self.products:
            return "Error: product not found"
        return json.dumps(self.products[product_id])

    def list_all_product_types(self) -> str:
        names = {p["name"]: p["product_id"] for p in self.products.values()}
        return json.dumps(dict(sorted(names.items())))

    def cancel_pending_order(self, order_id: str, reason: str) -> str:
        if order_id not in self.orders:
            return "Error: order not found"
        o = self.orders[order_id]
        if o["status"] != "pending":
            return "Error: non-pending order cannot be cancelled"
        if reason not in ("no longer needed", "ordered by mistake"):
            return "Error: invalid reason"
        refunds = []
        for p in o["payment_history"]:
            pid = p["payment_method_id"]
            refunds.append({"transaction_type": "refund", "amount": p["amount"], "payment_method_id": pid})
            if "gift_card" in pid:
                m = self.users[o["user_id"]]["payment_methods"][pid]
                m["balance"] = round(m["balance"] + p["amount"], 2)
        o["status"] = "cancelled"
        o["cancel_reason"] = reason
        o["payment_history"].extend(refunds)
        return json.dumps(o)

    def _diff(self, o: dict[str, Any], item_ids: list[str], new_item_ids: list[str]) -> float | str:
        have = [i["item_id"] for i in o["items"]]
        for i in item_ids:
            if item_ids.count(i) > have.count(i):
                return f"Error: {i} not found"
        if len(item_ids) != len(new_item_ids):
            return "Error: the number of items to be exchanged should match"
        diff = 0.0
        for old, new in zip(item_ids, new_item_ids):
            it = next(i for i in o["items"] if i["item_id"] == old)
            variants = self.products[it["product_id"]]["variants"]
            if new not in variants or not variants[new]["available"]:
                return f"Error: new item {new} not found or available"
            diff += variants[new]["price"] - it["price"]
        return diff  # tau-bench rounds it for an exchange, not for an item modification

    def exchange_delivered_order_items(self, order_id: str, item_ids: list[str],
                                       new_item_ids: list[str], payment_method_id: str) -> str:
        if order_id not in self.orders:
            return "Error: order not found"
        o = self.orders[order_id]
        if o["status"] != "delivered":
            return "Error: non-delivered order cannot be exchanged"
        diff = self._diff(o, item_ids, new_item_ids)
        if isinstance(diff, str):
            return diff
        diff = round(diff, 2)
        methods = self.users[o["user_id"]]["payment_methods"]
        if payment_method_id not in methods:
            return "Error: payment method not found"
        m = methods[payment_method_id]
        if m["source"] == "gift_card" and m["balance"] < diff:
            return "Error: insufficient gift card balance to pay for the price difference"
        o["status"] = "exchange requested"
        o["exchange_items"] = sorted(item_ids)
        o["exchange_new_items"] = sorted(new_item_ids)
        o["exchange_payment_method_id"] = payment_method_id
        o["exchange_price_difference"] = diff
        return json.dumps(o)

    def modify_pending_order_items(self, order_id: str, item_ids: list[str],
                                   new_item_ids: list[str], payment_method_id: str) -> str:
        if order_id not in self.orders:
            return "Error: order not found"
        o = self.orders[order_id]
        if o["status"] != "pending":
            return "Error: non-pending order cannot be modified"
        diff = self._diff(o, item_ids, new_item_ids)
        if isinstance(diff, str):
            return diff
        methods = self.users[o["user_id"]]["payment_methods"]
        if payment_method_id not in methods:
            return "Error: payment method not found"
        m = methods[payment_method_id]
        if m["source"] == "gift_card" and m["balance"] < diff:
            return "Error: insufficient gift card balance to pay for the new item"
        o["payment_history"].append({"transaction_type": "payment" if diff > 0 else "refund",
                                     "amount": abs(diff), "payment_method_id": payment_method_id})
        if m["source"] == "gift_card":
            m["balance"] = round(m["balance"] - diff, 2)
        for old, new in zip(item_ids, new_item_ids):
            it = next(i for i in o["items"] if i["item_id"] == old)
            v = self.products[it["product_id"]]["variants"][new]
            it["item_id"], it["price"], it["options"] = new, v["price"], v["options"]
        o["status"] = "pending (item modified)"
        return json.dumps(o)

    def modify_pending_order_payment(self, order_id: str, payment_method_id: str) -> str:
        if order_id not in self.orders:
            return "Error: order not found"
        o = self.orders[order_id]
        if o["status"] != "pending":
            return "Error: non-pending order cannot be modified"
        methods = self.users[o["user_id"]]["payment_methods"]
        if payment_method_id not in methods:
            return "Error: payment method not found"
        hist = o["payment_history"]
        if len(hist) > 1 or hist[0]["transaction_type"] != "payment":
            return "Error: there should be exactly one payment for a pending order"
        if hist[0]["payment_method_id"] == payment_method_id:
            return "Error: the new payment method should be different from the current one"
        amount = hist[0]["amount"]
        m = methods[payment_method_id]
        if m["source"] == "gift_card" and m["balance"] < amount:
            return "Error: insufficient gift card balance to pay for the order"
        old = hist[0]["payment_method_id"]
        hist.extend([
            {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old},
        ])
        if m["source"] == "gift_card":
            m["balance"] = round(m["balance"] - amount, 2)
        if "gift_card" in old:
            om = methods[old]
            om["balance"] = round(om["balance"] + amount, 2)
        return json.dumps(o)

    def modify_pending_order_address(self, order_id: str, address1: str, address2: str, city: str,
                                     state: str, country: str, zip: str) -> str:
        if order_id not in self.orders:
            return "Error: order not found"
        o = self.orders[order_id]
        if o["status"] != "pending":
            return "Error: non-pending order cannot be modified"
        o["address"] = {"address1": address1, "address2": address2, "city": city,
                        "state": state, "country": country, "zip": zip}
        return json.dumps(o)

    def modify_user_address(self, user_id: str, address1: str, address2: str, city: str,
                            state: str, country: str, zip: str) -> str:
        if user_id not in self.users:
            return "Error: user not found"
        u = self.users[user_id]
        u["address"] = {"address1": address1, "address2": address2, "city": city,
                        "state": state, "country": country, "zip": zip}
        return json.dumps(u)

    def return_delivered_order_items(self, order_id: str, item_ids: list[str],
                                     payment_method_id: str) -> str:
        if order_id not in self.orders:
            return "Error: order not found"
        o = self.orders[order_id]
        if o["status"] != "delivered":
            return "Error: non-delivered order cannot be returned"
        methods = self.users[o["user_id"]]["payment_methods"]
        if payment_method_id not in methods:
            return "Error: payment method not found"
        if ("gift_card" not in payment_method_id
                and payment_method_id != o["payment_history"][0]["payment_method_id"]):
            return "Error: payment method should be either the original payment method or a gift card"
        have = [i["item_id"] for i in o["items"]]
        for i in item_ids:
            if item_ids.count(i) > have.count(i):
                return "Error: some item not found"
        o["status"] = "return requested"
        o["return_items"] = sorted(item_ids)
        o["return_payment_method_id"] = payment_method_id
        return json.dumps(o)


# ----------------------------------------------------------------------------------------
# Conversations
# ----------------------------------------------------------------------------------------
class Seed:
    def __init__(self, scenario: str) -> None:
        self.scenario, self.store, self.turns = scenario, Store(), []

    def human(self, text: str) -> Seed:
        self.turns.append({"from": "human", "value": text})
        return self

    def gpt(self, text: str) -> Seed:
        self.turns.append({"from": "gpt", "value": text})
        return self

    def call(self, name: str, **arguments: Any) -> Any:
        self.turns.append({"from": "function_call",
                           "value": json.dumps({"name": name, "arguments": arguments})})
        obs = self.store.run(name, arguments)
        self.turns.append({"from": "observation", "value": obs})
        try:
            return json.loads(obs)
        except ValueError:
            return obs

    def by_email(self, email: str) -> dict[str, Any]:
        uid = self.call("find_user_id_by_email", email=email)
        return self.call("get_user_details", user_id=uid)


SEEDS: list[Seed] = []


def seed(scenario: str) -> Seed:
    s = Seed(scenario)
    SEEDS.append(s)
    return s


# --- identification and information --------------------------------------------------
s = seed("order_status_by_email")
s.human("Hi, where is my desk lamp order? My email is mia.ortiz4821@example.com.")
s.by_email("mia.ortiz4821@example.com")
o = s.call("get_order_details", order_id="#W8402615")
s.gpt("Thanks, Mia. Your order #W8402615 (Desk Lamp, black, medium brightness, AC adapter) has "
      "been processed and is on its way; the tracking number is 447120938561.")
s.human("Great, thanks!")
s.gpt("You're welcome! Is there anything else I can help you with?")

s = seed("order_status_by_name_zip")
s.human("Hello, I can't remember which email I used. I'm Ethan Brooks, zip code 27601. "
        "Has my coffee maker shipped?")
s.call("find_user_id_by_name_zip", first_name="Ethan", last_name="Brooks", zip="27601")
s.call("get_user_details", user_id="ethan_brooks_1042")
s.call("get_order_details", order_id="#W5548023")
s.gpt("Thank you, Ethan. Your order #W5548023 with the stainless steel 8-cup drip Coffee Maker "
      "(built-in grinder) has been processed and shipped; the tracking number is 774019263558.")
s.human("Perfect, that's all.")
s.gpt("Glad I could help. Have a nice day!")

s = seed("identify_email_not_found_then_name_zip")
s.human("Hi, I want to check my orders. My email is liam.chen@example.com.")
s.call("find_user_id_by_email", email="liam.chen@example.com")
s.gpt("I couldn't find an account with that email. Could you give me your first name, last name "
      "and the zip code of your default address instead?")
s.human("Sure: Liam Chen, 80203.")
s.call("find_user_id_by_name_zip", first_name="Liam", last_name="Chen", zip="80203")
s.call("get_user_details", user_id="liam_chen_5518")
s.gpt("Thanks, Liam, I found your account. You have three orders: #W4471930, #W2950638 and "
      "#W6183204. Which one would you like to know about?")
s.human("Just #W2950638 please.")
s.call("get_order_details", order_id="#W2950638")
s.gpt("Order #W2950638 is pending: a white battery-powered Desk Lamp (low brightness, $39.00) "
      "and a navy cotton crew-neck T-Shirt in size L ($24.50), paid with your Amex credit card.")

s = seed("identify_user_id_is_not_enough")
s.human("My user id is noah_kim_7305. What's the status of order #W6620184?")
s.gpt("I'm happy to help. Before I can look at any order I need to verify your identity: "
      "could you tell me the email address on your account?")
s.human("It's noah.kim7305@example.com.")
s.call("find_user_id_by_email", email="noah.kim7305@example.com")
s.call("get_order_details", order_id="#W6620184")
s.gpt("Thank you, Noah. Order #W6620184 (black Wireless Earbuds, 6-hour battery, IPX4, $129.00) "
      "is still pending; it has not shipped yet.")
s.human("Okay thanks.")
s.gpt("You're welcome!")

s = seed("product_catalog_lookup")
s.human("Hi, I'm Zoe Nguyen, zoe.nguyen8817@example.com. Do you sell water bottles, and in "
        "which sizes?")
s.call("find_user_id_by_email", email="zoe.nguyen8817@example.com")
s.call("list_all_product_types")
s.call("get_product_details", product_id="3840672915")
s.gpt("Yes, we sell Water Bottles (product id 3840672915). The available items are: 500ml "
      "stainless steel in blue ($18.99), 750ml stainless steel in black ($21.49) and 1000ml "
      "plastic in green ($14.50).")
s.human("Thanks, good to know.")
s.gpt("You're welcome! Anything else I can do for you?")

s = seed("product_availability")
s.human("Hello, this is Liam Chen (liam.chen5518@example.com). Is the blue running shoe in "
        "size 11 available? I bought the black ones in order #W4471930.")
s.call("find_user_id_by_email", email="liam.chen5518@example.com")
s.call("get_order_details", order_id="#W4471930")
s.call("get_product_details", product_id="6602814735")
s.gpt("I checked the Running Shoes: the blue mesh size 11 pair (item 4470385219) is currently "
      "not available. Available are black mesh size 9 ($89.99), black mesh size 10 ($94.50) "
      "and grey knit size 10 ($92.00).")
s.human("Too bad. Thanks anyway.")
s.gpt("You're welcome. Let me know if there's anything else.")

s = seed("refuse_other_user")
s.human("Hi, I'm Ava Patel, ava.patel6634@example.com. Can you also tell me what my friend Mia "
        "Ortiz ordered? Her zip is 43215.")
s.call("find_user_id_by_email", email="ava.patel6634@example.com")
s.gpt("Thank you, Ava, I've verified your account. I'm sorry, but I can only help with your own "
      "account and orders, so I can't look up or share anything about another customer. Is "
      "there anything about your own orders I can help with?")
s.human("No, that was it.")
s.gpt("Alright. Have a good day!")

# --- cancellations ----------------------------------------------------------------------
s = seed("cancel_pending_credit_card")
s.human("I'd like to cancel order #W2950638, I don't need it anymore. Email: "
        "liam.chen5518@example.com")
s.by_email("liam.chen5518@example.com")
s.call("get_order_details", order_id="#W2950638")
s.gpt("Order #W2950638 is pending, so it can be cancelled: a white Desk Lamp ($39.00) and a navy "
      "T-Shirt size L ($24.50), $63.50 in total, refunded to your Amex card ending 3008 within "
      "5 to 7 business days. Reason: no longer needed. Shall I cancel it (yes/no)?")
s.human("Yes, please.")
s.call("cancel_pending_order", order_id="#W2950638", reason="no longer needed")
s.gpt("Done: order #W2950638 is cancelled and the $63.50 refund is on its way to your card ending "
      "3008 (5 to 7 business days).")

s = seed("cancel_pending_gift_card_refund")
s.human("Hi, Sofia Reyes here, zip 78701. I ordered a keyboard and a bottle by mistake, order "
        "#W7719302. Please cancel it.")
s.call("find_user_id_by_name_zip", first_name="Sofia", last_name="Reyes", zip="78701")
s.call("get_user_details", user_id="sofia_reyes_2290")
s.call("get_order_details", order_id="#W7719302")
s.gpt("Order #W7719302 is pending: a tactile RGB full-size Mechanical Keyboard ($119.99) and a 750ml "
      "black Water Bottle ($21.49), paid $141.48 with your Mastercard ending 1904. I'll cancel it "
      "with the reason 'ordered by mistake'; the refund reaches the card in 5 to 7 business days. "
      "Do you confirm (yes/no)?")
s.human("Yes.")
s.call("cancel_pending_order", order_id="#W7719302", reason="ordered by mistake")
s.gpt("Order #W7719302 is cancelled. $141.48 will be back on your Mastercard ending 1904 within 5 "
      "to 7 business days.")

s = seed("cancel_reason_clarified")
s.human("Cancel my order #W6620184, I found the earbuds cheaper elsewhere. I'm Noah Kim, "
        "noah.kim7305@example.com.")
s.call("find_user_id_by_email", email="noah.kim7305@example.com")
s.call("get_order_details", order_id="#W6620184")
s.gpt("Order #W6620184 is pending and can be cancelled. For the cancellation I need one of two "
      "reasons: 'no longer needed' or 'ordered by mistake'. Which one applies?")
s.human("Then no longer needed.")
s.gpt("Thanks. I'll cancel #W6620184 (black Wireless Earbuds, $129.00) with the reason 'no "
      "longer needed'; the $129.00 goes back to your PayPal account paypal_6208413 within 5 to 7 "
      "business days. Shall I proceed (yes/no)?")
s.human("Yes, go ahead.")
s.call("cancel_pending_order", order_id="#W6620184", reason="no longer needed")
s.gpt("Your order #W6620184 is cancelled and the refund of $129.00 is on its way to your PayPal "
      "account.")

s = seed("cancel_refused_processed")
s.human("Please cancel my coffee maker order #W5548023. Ethan Brooks, ethan.brooks1042@example.com.")
s.call("find_user_id_by_email", email="ethan.brooks1042@example.com")
s.call("get_order_details", order_id="#W5548023")
s.gpt("I'm sorry, Ethan: order #W5548023 has already been processed and shipped, and only pending "
      "orders can be cancelled. Once it is delivered you can ask for a return.")
s.human("Okay, I'll wait for it then.")
s.gpt("Understood. Let me know if there's anything else.")

s = seed("cancel_refused_item_modified")
s.human("Hi, sofia.reyes2290@example.com. I want to cancel order #W9035517.")
s.call("find_user_id_by_email", email="sofia.reyes2290@example.com")
s.call("get_order_details", order_id="#W9035517")
s.gpt("I'm sorry, Sofia, order #W9035517 has status 'pending (item modified)': its items were "
      "already changed once, and after that an order can no longer be cancelled or modified.")
s.human("I see. Thanks.")
s.gpt("You're welcome.")

# --- modifying pending orders -----------------------------------------------------------
s = seed("modify_order_address")
s.human("Hi, mia.ortiz4821@example.com here. Please ship my pending order #W2378156 to my office: "
        "1200 Oak Street, Floor 4, Columbus, OH 43210, USA.")
s.call("find_user_id_by_email", email="mia.ortiz4821@example.com")
s.call("get_order_details", order_id="#W2378156")
s.gpt("Order #W2378156 is pending, so its shipping address can be changed. New address: 1200 Oak "
      "Street, Floor 4, Columbus, OH 43210, USA. Shall I update it (yes/no)?")
s.human("Yes please.")
s.call("modify_pending_order_address", order_id="#W2378156", address1="1200 Oak Street",
       address2="Floor 4", city="Columbus", state="OH", country="USA", zip="43210")
s.gpt("Done: order #W2378156 will now be shipped to 1200 Oak Street, Floor 4, Columbus, OH 43210.")

s = seed("modify_order_address_refused_delivered")
s.human("Can you change the shipping address of #W1960374? Ethan Brooks, zip 27601.")
s.call("find_user_id_by_name_zip", first_name="Ethan", last_name="Brooks", zip="27601")
s.call("get_order_details", order_id="#W1960374")
s.gpt("I'm sorry, Ethan, order #W1960374 has already been delivered, and only pending orders can "
      "have their shipping address changed.")
s.human("Okay.")
s.gpt("Is there anything else I can help with?")

s = seed("modify_payment_refused_gift_card_balance")
s.human("I'd like to pay order #W7302849 with my gift card instead... wait, how much is on it? "
        "Zoe Nguyen, zoe.nguyen8817@example.com.")
u = s.by_email("zoe.nguyen8817@example.com")
s.call("get_order_details", order_id="#W7302849")
s.gpt("Order #W7302849 costs $71.48 (a silver USB Desk Lamp, $52.49, and a blue 500ml Water Bottle, "
      "$18.99). Your gift card gift_card_9402816 has a balance of $15.00, which does not cover the "
      "total, so it cannot pay for this order. The order stays on your Discover card ending 6618.")
s.human("Fine, keep it on the card.")
s.gpt("Alright, nothing was changed. Anything else?")

s = seed("modify_order_payment_to_paypal")
s.human("Hi, Liam Chen, liam.chen5518@example.com. For #W2950638, charge my PayPal instead of my "
        "credit card.")
s.by_email("liam.chen5518@example.com")
s.call("get_order_details", order_id="#W2950638")
s.gpt("Order #W2950638 is pending and was paid $63.50 with your Amex ending 3008. I'll charge "
      "$63.50 to PayPal paypal_9170264 and refund the card (5 to 7 business days). Confirm "
      "(yes/no)?")
s.human("Yes.")
s.call("modify_pending_order_payment", order_id="#W2950638", payment_method_id="paypal_9170264")
s.gpt("Done: #W2950638 is now paid with PayPal, and $63.50 will be refunded to your Amex card "
      "within 5 to 7 business days.")

s = seed("modify_order_items_pay_difference")
s.human("Hello, ava.patel6634@example.com. In my pending order #W8861427 I'd rather have the green "
        "medium backpack instead of the black large one.")
s.by_email("ava.patel6634@example.com")
s.call("get_order_details", order_id="#W8861427")
s.call("get_product_details", product_id="7418250963")
s.gpt("The green medium nylon Backpack with laptop compartment (item 9264038175) is available at "
      "$59.00; you paid $64.50 for the black large one, so $5.50 would be refunded. Item changes "
      "can be made only once per order: is this the only item you want to change, and should the "
      "$5.50 go back to your Visa ending 5522?")
s.human("Yes, that's the only change, refund to the Visa.")
s.gpt("To confirm: order #W8861427, Backpack 4058173926 -> 9264038175, $5.50 refunded to "
      "credit_card_7718290. After this the order can't be modified or cancelled again. Proceed "
      "(yes/no)?")
s.human("Yes, go ahead.")
s.call("modify_pending_order_items", order_id="#W8861427", item_ids=["4058173926"],
       new_item_ids=["9264038175"], payment_method_id="credit_card_7718290")
s.gpt("Done: order #W8861427 now holds the green medium Backpack, and $5.50 is refunded to your "
      "Visa ending 5522. The order status is now 'pending (item modified)'.")

s = seed("modify_order_items_several_gift_card")
s.human("Hi! Mia Ortiz, mia.ortiz4821@example.com. In order #W2378156 I want the white v-neck "
        "shirt in M and the stainless steel coffee maker with the grinder instead.")
s.call("find_user_id_by_email", email="mia.ortiz4821@example.com")
s.call("get_user_details", user_id="mia_ortiz_4821")
s.call("get_order_details", order_id="#W2378156")
s.call("get_product_details", product_id="4173920658")
s.call("get_product_details", product_id="5031798426")
s.call("calculate", expression="(27.25 - 24.5) + (81.3 - 74.95)")
s.gpt("Both are available: T-Shirt 7350218846 -> 5583027714 (white organic cotton v-neck M, "
      "$27.25) and Coffee Maker 1883064725 -> 6407219583 (stainless steel 8 cups with built-in "
      "grinder, $81.30). The difference to pay is $9.10. Which payment method should pay it: "
      "your Visa ending 7731 or your gift card gift_card_4832716 (balance $120.00)? And are these "
      "all the items you want to change? This can only be done once.")
s.human("Those two are all. Use the gift card. Yes, do it.")
s.call("modify_pending_order_items", order_id="#W2378156",
       item_ids=["7350218846", "1883064725"], new_item_ids=["5583027714", "6407219583"],
       payment_method_id="gift_card_4832716")
s.gpt("Done: order #W2378156 now holds the white v-neck T-Shirt and the stainless steel Coffee "
      "Maker with grinder. $9.10 was paid from your gift card, which now has $110.90 left.")

s = seed("modify_items_refused_other_product")
s.human("I'm Noah Kim, noah.kim7305@example.com. Can you swap the earbuds in #W6620184 for a "
        "mechanical keyboard?")
s.call("find_user_id_by_email", email="noah.kim7305@example.com")
s.call("get_order_details", order_id="#W6620184")
s.gpt("I'm sorry, Noah: an item in a pending order can only be changed to another option of the "
      "same product, so the Wireless Earbuds cannot become a Mechanical Keyboard. I can change "
      "them to other earbud options, or cancel the order if you no longer need it.")
s.human("Never mind then.")
s.gpt("No problem. Is there anything else I can help you with?")

s = seed("modify_items_refused_unavailable")
s.human("Hello, Sofia Reyes (sofia.reyes2290@example.com). Could I change the earbuds in "
        "#W9035517 to the blue ones?")
s.call("find_user_id_by_email", email="sofia.reyes2290@example.com")
s.call("get_order_details", order_id="#W9035517")
s.gpt("I'm sorry, Sofia: order #W9035517 already had its items modified (status 'pending (item "
      "modified)'), and items can be changed only once per order, so I can't change them again.")
s.human("Oh well.")
s.gpt("Anything else I can do for you?")

# --- returns ----------------------------------------------------------------------------
s = seed("return_to_original_payment")
s.human("Hi, I want to return the running shoes from order #W5193047. mia.ortiz4821@example.com")
s.by_email("mia.ortiz4821@example.com")
s.call("get_order_details", order_id="#W5193047")
s.gpt("Order #W5193047 was delivered, so it can be returned: Running Shoes, black mesh size 9 "
      "(item 3305917428), $89.99. The refund can go to the original payment method, your Visa "
      "ending 7731, or to your gift card gift_card_4832716. Which do you prefer?")
s.human("Back to the Visa.")
s.gpt("To confirm: return item 3305917428 from order #W5193047, refund $89.99 to "
      "credit_card_3917264. Proceed (yes/no)?")
s.human("Yes.")
s.call("return_delivered_order_items", order_id="#W5193047", item_ids=["3305917428"],
       payment_method_id="credit_card_3917264")
s.gpt("Your return is requested: order #W5193047 is now 'return requested', and you will receive "
      "an email explaining how to send the shoes back. The $89.99 goes to your Visa ending 7731.")

s = seed("return_several_items_to_gift_card")
s.human("Noah Kim, zip 04101. I want to return both items of order #W3049781 and get the money "
        "on my gift card.")
s.call("find_user_id_by_name_zip", first_name="Noah", last_name="Kim", zip="04101")
s.call("get_user_details", user_id="noah_kim_7305")
s.call("get_order_details", order_id="#W3049781")
s.call("calculate", expression="59.0 + 18.99")
s.gpt("Order #W3049781 was delivered. Returning both items, the green medium Backpack "
      "(9264038175, $59.00) and the blue 500ml Water Bottle (8502614937, $18.99), refunds "
      "$77.99 to your gift card gift_card_1175930. Shall I request the return (yes/no)?")
s.human("Yes please.")
s.call("return_delivered_order_items", order_id="#W3049781",
       item_ids=["9264038175", "8502614937"], payment_method_id="gift_card_1175930")
s.gpt("Done. Order #W3049781 is now 'return requested'; you'll get an email with the return "
      "instructions, and $77.99 will be refunded to your gift card.")

s = seed("return_refused_other_card")
s.human("I'm Liam Chen, liam.chen5518@example.com. I want to return the grey running shoes... no "
        "wait, the black ones from #W4471930, refund to my Amex please.")
s.by_email("liam.chen5518@example.com")
s.call("get_order_details", order_id="#W4471930")
s.gpt("Order #W4471930 was delivered and paid with PayPal (paypal_9170264). A refund can only go to "
      "the original payment method or a gift card, and you have no gift card, so it cannot go to "
      "your Amex. Would you like the $94.50 for the black size 10 Running Shoes refunded to your "
      "PayPal account instead?")
s.human("Okay, PayPal then. Yes, go ahead.")
s.call("return_delivered_order_items", order_id="#W4471930", item_ids=["1148290376"],
       payment_method_id="paypal_9170264")
s.gpt("The return is requested: order #W4471930 is 'return requested', $94.50 goes back to your "
      "PayPal account, and an email with the return instructions is on its way.")

s = seed("return_refused_not_delivered")
s.human("Hi, mia.ortiz4821@example.com. I want to return the desk lamp from #W8402615.")
s.call("find_user_id_by_email", email="mia.ortiz4821@example.com")
s.call("get_order_details", order_id="#W8402615")
s.gpt("I'm sorry, Mia: order #W8402615 is processed but not delivered yet, and only delivered "
      "orders can be returned. Once it arrives, I can help you with the return.")
s.human("Alright, I'll come back later.")
s.gpt("Sounds good. Have a nice day!")

s = seed("return_duplicate_items")
s.human("Hello, Sofia Reyes, sofia.reyes2290@example.com. I got two white v-neck shirts in "
        "#W1284096 and want to return both of them.")
s.call("find_user_id_by_email", email="sofia.reyes2290@example.com")
s.call("get_user_details", user_id="sofia_reyes_2290")
s.call("get_order_details", order_id="#W1284096")
s.gpt("Order #W1284096 was delivered with two white v-neck T-Shirts (item 5583027714, $27.25 "
      "each). Returning both refunds $54.50, either to your Mastercard ending 1904 (the original "
      "payment) or your gift card gift_card_6093381. Which one?")
s.human("The gift card. Yes, please proceed.")
s.call("return_delivered_order_items", order_id="#W1284096",
       item_ids=["5583027714", "5583027714"], payment_method_id="gift_card_6093381")
s.gpt("Done: both shirts from #W1284096 are in a return request, and $54.50 will be refunded to "
      "your gift card. You'll receive an email with the return instructions.")

# --- exchanges --------------------------------------------------------------------------
s = seed("exchange_single_item")
s.human("Hi, Ethan Brooks, ethan.brooks1042@example.com. The grey running shoes from #W1960374 "
        "are good but I'd like them in black, same size.")
s.call("find_user_id_by_email", email="ethan.brooks1042@example.com")
s.call("get_order_details", order_id="#W1960374")
s.call("get_product_details", product_id="6602814735")
s.gpt("Order #W1960374 was delivered, so it can be exchanged. Black mesh size 10 with foam sole "
      "(item 1148290376) is available at $94.50; you paid $92.00, so the difference is $2.50, "
      "charged to your PayPal account paypal_3384910. Is this the only item to exchange? An "
      "exchange can be requested only once per order.")
s.human("Yes, only that one. Go ahead.")
s.call("exchange_delivered_order_items", order_id="#W1960374", item_ids=["9021746683"],
       new_item_ids=["1148290376"], payment_method_id="paypal_3384910")
s.gpt("Your exchange is requested: order #W1960374 is now 'exchange requested', $2.50 is charged "
      "to your PayPal, and you'll get an email explaining how to send the grey pair back.")

s = seed("exchange_several_items_refund")
s.human("Hi, I'm Ava Patel, zip 60614. From order #W3307152 I want to exchange the coffee maker for "
        "the red french press and the keyboard for the tactile RGB one.")
s.call("find_user_id_by_name_zip", first_name="Ava", last_name="Patel", zip="60614")
s.call("get_user_details", user_id="ava_patel_6634")
s.call("get_order_details", order_id="#W3307152")
s.call("get_product_details", product_id="5031798426")
s.call("get_product_details", product_id="1507394826")
s.call("think", thought="Coffee Maker 1883064725 ($74.95) -> 3951826047 ($68.40); Keyboard "
       "2360918574 ($109.00) -> 5829471036 ($119.99). Both new items are available and of the "
       "same products; compute the net difference.")
s.call("calculate", expression="(68.4 - 74.95) + (119.99 - 109.0)")
s.gpt("Both are available: the red 4-cup French press Coffee Maker (3951826047, $68.40) and the "
      "tactile RGB full-size Mechanical Keyboard (5829471036, $119.99). Net, you pay $4.44 more. "
      "Which payment method should pay it: your Visa ending 5522, or gift card gift_card_2837465 "
      "(balance $40.00)? Please also confirm these two are all the items to exchange.")
s.human("That's all. Use the gift card. Yes.")
s.call("exchange_delivered_order_items", order_id="#W3307152",
       item_ids=["1883064725", "2360918574"], new_item_ids=["3951826047", "5829471036"],
       payment_method_id="gift_card_2837465")
s.gpt("Done: the exchange for order #W3307152 is requested ($4.44 from your gift card). You'll "
      "receive an email with instructions for sending back the old coffee maker and keyboard.")

s = seed("exchange_refused_unavailable")
s.human("Liam Chen here, liam.chen5518@example.com. I want to swap the shoes in #W4471930 for the "
        "blue size 11.")
s.call("find_user_id_by_email", email="liam.chen5518@example.com")
s.call("get_order_details", order_id="#W4471930")
s.call("get_product_details", product_id="6602814735")
s.gpt("I'm sorry, Liam, the blue mesh size 11 Running Shoes (item 4470385219) are not available "
      "right now, so I can't exchange for them. Available options are black size 9 ($89.99), black "
      "size 10 (your current pair) and grey knit size 10 ($92.00).")
s.human("I'll wait until they are back. Thanks.")
s.gpt("You're welcome. Have a great day!")

s = seed("exchange_refused_already_requested")
s.human("Hi, zoe.nguyen8817@example.com. I want to exchange the shoes in #W4016728 for a bigger "
        "size.")
s.call("find_user_id_by_email", email="zoe.nguyen8817@example.com")
s.call("get_order_details", order_id="#W4016728")
s.gpt("I'm sorry, Zoe: order #W4016728 already has an exchange requested, and an order can be "
      "exchanged only once. It is no longer in 'delivered' status, so I can't request another "
      "exchange.")
s.human("Okay, can I talk to a human about it?")
s.call("transfer_to_human_agents", summary="Zoe Nguyen (zoe_nguyen_8817) wants a second exchange "
       "(bigger size) on order #W4016728, which already has an exchange requested; asked for a "
       "human agent.")
s.gpt("I've transferred you to a human agent, who will continue from here.")

s = seed("exchange_refused_pending_modify_instead")
s.human("Zoe Nguyen, zip 92101. Actually I already have the... never mind. Can I exchange the "
        "desk lamp in #W7302849?")
s.call("find_user_id_by_name_zip", first_name="Zoe", last_name="Nguyen", zip="92101")
s.call("get_order_details", order_id="#W7302849")
s.gpt("Order #W7302849 is still pending, so it can't be exchanged (only delivered orders can). "
      "While it's pending I can change the lamp to another option instead. Would you like that?")
s.human("Yes, the black one with medium brightness, paid with my gift card.")
s.call("get_user_details", user_id="zoe_nguyen_8817")
s.call("get_product_details", product_id="9385160274")
s.call("calculate", expression="45.99 - 52.49")
s.gpt("The black medium-brightness Desk Lamp (2704918365) costs $45.99, $6.50 less than your "
      "silver lamp, so $6.50 would be refunded to gift card gift_card_9402816. Is this the only "
      "item to change? Items can be changed only once. Proceed (yes/no)?")
s.human("Yes, that's the only one.")
s.call("modify_pending_order_items", order_id="#W7302849", item_ids=["5162093847"],
       new_item_ids=["2704918365"], payment_method_id="gift_card_9402816")
s.gpt("Done: order #W7302849 now has the black Desk Lamp, and $6.50 was refunded to your gift "
      "card (new balance $21.50).")

# --- profile, transfers, errors ---------------------------------------------------------
s = seed("modify_user_address")
s.human("Hi, I moved. Please update my default address to 19 Elm Street, Apt 7, Portland, ME "
        "04102. Email noah.kim7305@example.com.")
s.by_email("noah.kim7305@example.com")
s.gpt("Thanks, Noah. I'll change your default address from 88 Harbor Street, Portland, ME 04101 to "
      "19 Elm Street, Apt 7, Portland, ME 04102, USA. Existing orders keep their shipping "
      "address. Confirm (yes/no)?")
s.human("Yes.")
s.call("modify_user_address", user_id="noah_kim_7305", address1="19 Elm Street", address2="Apt 7",
       city="Portland", state="ME", country="USA", zip="04102")
s.gpt("Your default address is now 19 Elm Street, Apt 7, Portland, ME 04102, USA.")

s = seed("transfer_damaged_item")
s.human("Hello, sofia.reyes2290@example.com. The backpack I received in #W1284096 is torn and I "
        "want compensation for the damage, not a return.")
s.call("find_user_id_by_email", email="sofia.reyes2290@example.com")
s.call("get_order_details", order_id="#W1284096")
s.gpt("I'm sorry about the damaged backpack. I can request a return or an exchange of it, but "
      "compensation for damage is not something I can handle with my tools. Would you like a "
      "return or exchange, or should I transfer you to a human agent?")
s.human("Transfer me to a human, please.")
s.call("transfer_to_human_agents", summary="Sofia Reyes (sofia_reyes_2290) received a torn "
       "Backpack (item 2617405839) in delivered order #W1284096 and wants compensation rather "
       "than a return or exchange.")
s.gpt("I've transferred you to a human agent who can look into compensation for the damaged "
      "backpack.")

s = seed("transfer_explicit_request")
s.human("I just want to talk to a real person.")
s.gpt("I can transfer you. First, could you give me the email on your account so the agent knows "
      "who you are?")
s.human("ethan.brooks1042@example.com")
s.call("find_user_id_by_email", email="ethan.brooks1042@example.com")
s.call("transfer_to_human_agents", summary="Ethan Brooks (ethan_brooks_1042) asked to speak to a "
       "human agent without stating an issue.")
s.gpt("Thank you, Ethan. I've transferred you to a human agent.")

s = seed("tool_error_recovery")
s.human("Hi, ava.patel6634@example.com. What's the status of order #W8861247?")
s.call("find_user_id_by_email", email="ava.patel6634@example.com")
s.call("get_order_details", order_id="#W8861247")
s.gpt("I couldn't find order #W8861247. Could you double-check the order number?")
s.human("Sorry, I swapped two digits: it's #W8861427.")
s.call("get_order_details", order_id="#W8861427")
s.gpt("Order #W8861427 (black large nylon Backpack, $64.50) is pending and has not shipped yet.")

s = seed("wrong_product_id_recovery")
s.human("Hi, mia.ortiz4821@example.com. Which other colors does the t-shirt in #W2378156 come in?")
s.call("find_user_id_by_email", email="mia.ortiz4821@example.com")
s.call("get_order_details", order_id="#W2378156")
s.call("get_product_details", product_id="7350218846")
s.call("get_product_details", product_id="4173920658")
s.gpt("The T-Shirt comes in navy (M and L, cotton crew neck, $24.50), white (M, organic cotton "
      "v-neck, $27.25) and red (S, polyester crew neck, $22.00, currently not available).")
s.human("Thanks!")
s.gpt("You're welcome!")


def main() -> None:
    tools = json.loads((ROOT / "prompts/retail/tools.json").read_text(encoding="utf-8"))
    public = json.dumps([{k: v for k, v in t.items() if k != "x-kind"} for t in tools])
    policy = (ROOT / "prompts/retail/policy.md").read_text(encoding="utf-8")
    with (HERE / "seeds.jsonl").open("w", encoding="utf-8") as f:
        for s in SEEDS:
            record = {"conversations": s.turns, "tools": public, "system": policy,
                      "metadata": {"scenario": s.scenario}}
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    print(f"{len(SEEDS)} seeds")


if __name__ == "__main__":
    main()
