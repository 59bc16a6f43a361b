"""``python -m factory.schemas``: regenerate the shipped recipe JSON Schema and, from a
checkout (a ``mkdocs.yml`` in the current folder), the documentation site's recipe
reference ``docs/reference/recipe.md``; ``--markdown PATH`` writes the page elsewhere."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from factory.recipe import SCHEMA_PATH, json_schema
from factory.schemas import recipe_reference

REFERENCE_PAGE = Path("docs") / "reference" / "recipe.md"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m factory.schemas", description=__doc__)
    parser.add_argument(
        "--markdown",
        type=Path,
        default=REFERENCE_PAGE if Path("mkdocs.yml").is_file() else None,
        help=f"write the recipe reference page here (default in a checkout: {REFERENCE_PAGE})",
    )
    args = parser.parse_args(argv)
    schema = json_schema()
    SCHEMA_PATH.write_text(json.dumps(schema, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(recipe_reference(schema), encoding="utf-8")
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
