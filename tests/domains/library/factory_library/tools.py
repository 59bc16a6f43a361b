"""The library's three tools: ``fn(data, **arguments) -> observation``; a refusal raises."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from factory.errors import EnvironmentError_

__all__ = ["PARAMETERS", "TODAY", "TOOLS", "WRITE_TOOLS", "write_targets"]

TODAY = "2025-03-01"
LOAN_DAYS = "2025-03-22"  # every loan is due three weeks after TODAY

Data = dict[str, Any]


def get_member_details(data: Data, member_id: str) -> str:
    if member_id not in data["members"]:
        raise EnvironmentError_("member not found")
    return json.dumps(data["members"][member_id])


def search_books(data: Data, title: str) -> str:
    words = title.lower()
    found = [b for b in data["books"].values() if words in b["title"].lower()]
    return json.dumps(found)


def checkout_book(data: Data, member_id: str, book_id: str) -> str:
    if member_id not in data["members"]:
        raise EnvironmentError_("member not found")
    if book_id not in data["books"]:
        raise EnvironmentError_("book not found")
    member, book = data["members"][member_id], data["books"][book_id]
    loan_id = f"L-{member_id}-{book_id}"
    if loan_id in member["loans"]:
        raise EnvironmentError_(f"member {member_id} already has {book_id} on loan")
    if len(member["loans"]) >= member["max_loans"]:
        raise EnvironmentError_(f"member {member_id} has reached {member['max_loans']} loans")
    if book["copies_available"] < 1:
        raise EnvironmentError_(f"no copy of {book_id} is available")
    book["copies_available"] -= 1
    member["loans"].append(loan_id)
    loan = {"loan_id": loan_id, "member_id": member_id, "book_id": book_id, "due": LOAN_DAYS}
    data["loans"][loan_id] = loan
    return json.dumps(loan)


TOOLS: dict[str, Callable[..., str]] = {
    "get_member_details": get_member_details,
    "search_books": search_books,
    "checkout_book": checkout_book,
}
WRITE_TOOLS = frozenset({"checkout_book"})

_STR = {"type": "string"}
PARAMETERS: dict[str, dict[str, Any]] = {
    "get_member_details": {
        "type": "object",
        "properties": {"member_id": _STR},
        "required": ["member_id"],
    },
    "search_books": {"type": "object", "properties": {"title": _STR}, "required": ["title"]},
    "checkout_book": {
        "type": "object",
        "properties": {"member_id": _STR, "book_id": _STR},
        "required": ["member_id", "book_id"],
    },
}


def write_targets(data: Data, name: str, arguments: dict[str, Any]) -> list[tuple[str, str]]:
    """The records a checkout changes: the member and the book (the loan is new)."""
    if name != "checkout_book":
        return []
    member, book = arguments.get("member_id"), arguments.get("book_id")
    out = [("members", member)] if member in data["members"] else []
    return out + ([("books", book)] if book in data["books"] else [])
