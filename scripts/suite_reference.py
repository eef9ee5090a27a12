"""Writes docs/suite-reference.md from the suite file's JSON schema (what `variantlab schema` prints): one
table per object — each field, its type, its default and its bounds, and what it does — so the reference
can never drift from what the suite accepts. tests/test_docs.py fails when the page is not what this
writes today.

    python scripts/suite_reference.py            # rewrite docs/suite-reference.md
    python scripts/suite_reference.py --check    # exit 1 when it is out of date
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "suite-reference.md"
HEAD = """# Suite reference

Every field of the suite file, generated from its JSON schema (`variantlab schema` prints the schema;
`python scripts/suite_reference.py` rewrites this page). Unknown keys, a key given twice and a value
of the wrong type (a boolean where a number belongs included) are refused with one line naming the
field. [The suite file](suite.md) explains how the parts fit together.
"""


def type_of(prop: dict) -> str:
    """A field's type in words: integer, string, one of a | b, list of X, an object's name, or X | null."""
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    if "enum" in prop:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{json.dumps(prop['const'])}`"
    if "anyOf" in prop or "oneOf" in prop:
        return " \\| ".join(dict.fromkeys(type_of(p) for p in prop.get("anyOf") or prop["oneOf"]))
    kind = prop.get("type", "any")
    if kind == "array":
        items = prop.get("items")
        return f"list of {type_of(items)}" if items else "list"
    if kind == "object" and isinstance(prop.get("additionalProperties"), dict):
        return f"map of {type_of(prop['additionalProperties'])}"
    return kind


def bounds(prop: dict) -> str:
    parts = []
    for key, word in (("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<"),
                      ("minLength", "length ≥"), ("maxLength", "length ≤"), ("minItems", "items ≥"),
                      ("maxItems", "items ≤")):
        if key in prop:
            parts.append(f"{word} {prop[key]}")
    for sub in prop.get("anyOf") or ():
        parts += [b for b in [bounds(sub)] if b]
    return ", ".join(dict.fromkeys(parts))


def shown_default(prop: dict) -> str:
    """A field's default as written, or where it is long (an object's, a list of objects) what it is."""
    if "default" not in prop:
        return ""
    value = prop["default"]
    if isinstance(value, dict) and value:
        return "each of its fields' defaults"
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return ", ".join(f"one `{v.get('type', '?')}`" for v in value)
    return f"`{json.dumps(value)}`"


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(name: str, schema: dict) -> str:
    lines = [f"## {name}", ""]
    if schema.get("description"):
        lines += [cell(schema["description"]), ""]
    lines += ["| field | type | default | bounds | what it does |", "|---|---|---|---|---|"]
    required = set(schema.get("required", ()))
    for field, prop in schema.get("properties", {}).items():
        default = "required" if field in required else shown_default(prop)
        lines.append(f"| `{field}` | {type_of(prop)} | {cell(default)} | {cell(bounds(prop))} | "
                     f"{cell(prop.get('description', ''))} |")
    return "\n".join(lines) + "\n"


def page() -> str:
    sys.path.insert(0, str(ROOT / "src"))
    from variantlab.suite import suite_json_schema
    schema = suite_json_schema()
    parts = [HEAD, table("Suite", schema)]
    for name, sub in sorted(schema.get("$defs", {}).items()):
        if sub.get("type") == "object" or "properties" in sub:
            parts.append(table(name, sub))
    return "\n".join(parts)


def main(argv: list[str]) -> int:
    text = page()
    if "--check" in argv:
        if not PAGE.is_file() or PAGE.read_text(encoding="utf-8") != text:
            print(f"{PAGE} is out of date: run python scripts/suite_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
