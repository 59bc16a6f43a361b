"""A generated library: members with a loan limit, books with copies, some loans out."""

from __future__ import annotations

import random
from typing import Any

from factory_library.tools import LOAN_DAYS

__all__ = ["generate_world"]

_FIRST = ("Ada", "Bo", "Chen", "Dara", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jun")
_LAST = ("Abe", "Berg", "Cruz", "Diaz", "Eno", "Falk", "Gold", "Hart")
_WORDS = ("Silent", "River", "Glass", "Winter", "Garden", "Night", "Paper", "Stone", "Salt")
_NOUNS = ("Harbor", "Atlas", "Orchard", "Letters", "Machine", "Crown", "Map", "Road")


def generate_world(seed: int, n_members: int = 12, n_books: int = 20) -> dict[str, Any]:
    """The library of ``seed``: ``n_members`` members, ``n_books`` books, a few loans.

    Raises:
        ValueError: a size below 1.
    """
    if n_members < 1 or n_books < 1:
        raise ValueError("n_members and n_books must be at least 1")
    rng = random.Random(f"library:{seed}")
    books = {}
    for i in range(1, n_books + 1):
        book_id = f"B{i:04d}"
        title = f"The {rng.choice(_WORDS)} {rng.choice(_NOUNS)}"
        author = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        copies = rng.choice((0, 1, 1, 2, 3))
        books[book_id] = {"book_id": book_id, "title": title, "author": author,
                          "copies_available": copies}  # fmt: skip
    members: dict[str, Any] = {}
    loans: dict[str, Any] = {}
    for i in range(1, n_members + 1):
        member_id = f"M{i:04d}"
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        member = {"member_id": member_id, "name": f"{first} {last}",
                  "email": f"{first.lower()}.{last.lower()}{i}@example.org",
                  "max_loans": rng.choice((2, 3, 5)), "loans": []}  # fmt: skip
        for book_id in rng.sample(sorted(books), rng.choice((0, 1, 2))):
            loan_id = f"L-{member_id}-{book_id}"
            member["loans"].append(loan_id)
            loans[loan_id] = {"loan_id": loan_id, "member_id": member_id, "book_id": book_id,
                              "due": LOAN_DAYS}  # fmt: skip
        members[member_id] = member
    return {"members": members, "books": books, "loans": loans}
