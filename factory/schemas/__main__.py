"""``python -m factory.schemas``: regenerate the shipped recipe JSON Schema."""

from __future__ import annotations

import json

from factory.config import SCHEMA_PATH, json_schema

if __name__ == "__main__":
    SCHEMA_PATH.write_text(json.dumps(json_schema(), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
