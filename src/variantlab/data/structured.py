"""Deterministic generator of structured-text question/answer samples.

Each sample is one small record set (orders, invoices, log lines or product specs) rendered as
compact JSON, key-value lines or a table, followed by a question whose ground-truth answer is
derivable from the record text:

    <record text>\\nQ: <question>\\nA:

and ``answer`` is the bare answer (no leading space, no newline). A model's target continuation is
``" " + answer`` followed by its end-of-sequence token.

Three tasks:
  extract  one record; "What is the customer?"                      -> a field value
  lookup   2-5 rows; "What is the price of SKU-4821?"               -> a field value of one row
  count    2-5 rows; "How many lines have level ERROR?"              -> "0" .. "5"

Sample ``i`` of seed ``s`` is drawn from ``random.Random(f"{s}:{i}")`` alone, so it never depends on
how many samples are requested: the first 64 of ``generate_samples(100_000, s)`` equal
``generate_samples(64, s)``. String seeding is stable across Python versions.
"""
from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

KINDS = ("order", "invoice", "log", "product")
FORMATS = ("json", "kv", "table")
TASKS = ("extract", "lookup", "count")

FIRST_NAMES = ("Alice", "Bruno", "Chen", "Dana", "Emil", "Fatima", "Goran", "Hana", "Ivan", "Julia",
               "Kofi", "Lena", "Marco", "Nadia", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tara",
               "Umar", "Vera", "Wei", "Yusuf", "Zoe")
LAST_NAMES = ("Smith", "Garcia", "Novak", "Kim", "Rossi", "Okafor", "Muller", "Tanaka", "Silva",
              "Dubois", "Khan", "Larsen", "Petrov", "Moreau", "Nguyen", "Weber", "Costa", "Ito")
CITIES = ("Lyon", "Oslo", "Porto", "Kyoto", "Austin", "Dublin", "Quito", "Lagos", "Pune", "Graz",
          "Turin", "Leeds", "Malmo", "Busan", "Perth", "Cork")
ORDER_STATUSES = ("pending", "shipped", "delivered", "cancelled", "returned")
VENDOR_STEMS = ("Acme", "Globex", "Initech", "Hooli", "Vandelay", "Umbra", "Nimbus", "Vertex",
                "Solaris", "Orbit", "Pioneer", "Zenith")
VENDOR_SUFFIXES = ("Corp", "Ltd", "GmbH", "Inc", "SA")
CURRENCIES = ("USD", "EUR", "GBP", "JPY", "CHF")
PAID = ("yes", "no")
LOG_LEVELS = ("INFO", "WARN", "ERROR", "DEBUG")
SERVICES = ("auth", "db", "api", "cache", "queue", "mail", "search")
STATUS_CODES = ("200", "201", "204", "301", "400", "401", "403", "404", "409", "429", "500", "502",
                "503", "504")
PRODUCT_ADJECTIVES = ("steel", "oak", "glass", "linen", "cotton", "bamboo", "copper", "wool")
PRODUCT_NOUNS = ("kettle", "desk", "lamp", "chair", "mug", "towel", "shelf", "bowl", "rug")
COLORS = ("red", "blue", "green", "black", "white", "grey", "yellow")
CATEGORIES = ("kitchen", "office", "garden", "bath", "decor")

# Precomputed choice lists: one random.choice each, no string building per sample.
FULL_NAMES = tuple(f"{f} {l}" for f in FIRST_NAMES for l in LAST_NAMES)
VENDORS = tuple(f"{s} {x}" for s in VENDOR_STEMS for x in VENDOR_SUFFIXES)
PRODUCT_NAMES = tuple(f"{a} {n}" for a in PRODUCT_ADJECTIVES for n in PRODUCT_NOUNS)

Row = dict[str, str]


# --- field values ----------------------------------------------------------------------------

def money(rng: random.Random, low_cents: int, high_cents: int) -> str:
    """An amount with two decimals, e.g. '53.20'."""
    cents = rng.randint(low_cents, high_cents)
    return f"{cents // 100}.{cents % 100:02d}"


def day(rng: random.Random) -> str:
    return f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def clock(rng: random.Random) -> str:
    return f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:{rng.randint(0, 59):02d}"


# --- record kinds ----------------------------------------------------------------------------
# Each kind: its key field, how to make distinct keys, how to fill the other fields, which of
# those are categorical (countable), which are numbers (unquoted in JSON), and the wording.

def order_row(rng: random.Random, key: str) -> Row:
    return {"order_id": key, "customer": rng.choice(FULL_NAMES),
            "status": rng.choice(ORDER_STATUSES), "total": money(rng, 500, 99999),
            "city": rng.choice(CITIES), "items": str(rng.randint(1, 9))}


def invoice_row(rng: random.Random, key: str) -> Row:
    return {"invoice": key, "vendor": rng.choice(VENDORS), "amount": money(rng, 1000, 999999),
            "currency": rng.choice(CURRENCIES), "due": day(rng), "paid": rng.choice(PAID)}


def log_row(rng: random.Random, key: str) -> Row:
    return {"time": key, "level": rng.choice(LOG_LEVELS), "service": rng.choice(SERVICES),
            "code": rng.choice(STATUS_CODES), "ms": str(rng.randint(1, 999))}


def product_row(rng: random.Random, key: str) -> Row:
    return {"sku": key, "name": rng.choice(PRODUCT_NAMES), "price": money(rng, 199, 49999),
            "color": rng.choice(COLORS), "stock": str(rng.randint(0, 250)),
            "category": rng.choice(CATEGORIES)}


def prefixed_keys(prefix: str, digits: int) -> Callable[[random.Random, int], list[str]]:
    low, high = 10 ** (digits - 1), 10 ** digits
    return lambda rng, k: [f"{prefix}{n}" for n in rng.sample(range(low, high), k)]


def clock_keys(rng: random.Random, k: int) -> list[str]:
    """k distinct times of day, in increasing order (log lines are time-ordered)."""
    seconds = sorted(rng.sample(range(86_400), k))
    return [f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}" for s in seconds]


KIND_SPECS: dict[str, dict] = {
    "order": {"key": "order_id", "keys": prefixed_keys("ORD-", 4), "row": order_row,
              "categorical": {"status": ORDER_STATUSES, "city": CITIES},
              "numeric": {"total", "items"}, "unit": "orders", "of": "of"},
    "invoice": {"key": "invoice", "keys": prefixed_keys("INV-", 5), "row": invoice_row,
                "categorical": {"currency": CURRENCIES, "paid": PAID},
                "numeric": {"amount"}, "unit": "invoices", "of": "of"},
    "log": {"key": "time", "keys": clock_keys, "row": log_row,
            "categorical": {"level": LOG_LEVELS, "service": SERVICES},
            "numeric": {"ms"}, "unit": "lines", "of": "at"},
    "product": {"key": "sku", "keys": prefixed_keys("SKU-", 4), "row": product_row,
                "categorical": {"color": COLORS, "category": CATEGORIES},
                "numeric": {"price", "stock"}, "unit": "products", "of": "of"},
}


# --- rendering -------------------------------------------------------------------------------

def render_json(rows: list[Row], columns: list[str], numeric: set[str], as_list: bool) -> str:
    """Compact JSON: one object, or a list of objects. Numbers unquoted; no value needs escaping."""
    objects = ["{" + ",".join(f'"{c}":{r[c]}' if c in numeric else f'"{c}":"{r[c]}"'
                              for c in columns) + "}" for r in rows]
    return "[" + ",".join(objects) + "]" if as_list else objects[0]


def render_kv(rows: list[Row], columns: list[str], kind: str, as_list: bool) -> str:
    """One record: 'key: value' lines. Several: one line per row ('k=v; k=v', logfmt for logs)."""
    if not as_list:
        return "\n".join(f"{c}: {rows[0][c]}" for c in columns)
    separator = " " if kind == "log" else "; "
    return "\n".join(separator.join(f"{c}={r[c]}" for c in columns) for r in rows)


def render_table(rows: list[Row], columns: list[str], delimiter: str) -> str:
    """A header line and one line per row, cells joined by ' | ' or ','."""
    lines = [delimiter.join(columns)]
    lines.extend(delimiter.join(r[c] for c in columns) for r in rows)
    return "\n".join(lines)


def render(rows: list[Row], columns: list[str], kind: str, fmt: str, as_list: bool,
           rng: random.Random) -> str:
    if fmt == "json":
        return render_json(rows, columns, KIND_SPECS[kind]["numeric"], as_list)
    if fmt == "kv":
        return render_kv(rows, columns, kind, as_list)
    return render_table(rows, columns, rng.choice((" | ", ",")))


# --- tasks -----------------------------------------------------------------------------------

def pick_columns(rng: random.Random, row: Row, key: str, required: str, extra: int) -> list[str]:
    """The key column, the column the question needs, and `extra` more, in the row's own order."""
    others = [c for c in row if c not in (key, required)]
    chosen = {key, required, *rng.sample(others, min(extra, len(others)))}
    return [c for c in row if c in chosen]


def extra_columns(n_rows: int, fmt: str) -> int:
    """How many columns beyond the two a question needs, so prompts stay near 80-260 chars."""
    if n_rows <= 3:
        return 2
    return 0 if fmt == "json" and n_rows == 5 else 1


def extract_task(rng: random.Random, kind: str, fmt: str) -> tuple[str, str, str]:
    spec = KIND_SPECS[kind]
    row = spec["row"](rng, spec["keys"](rng, 1)[0])
    asked = rng.choice([c for c in row if c != spec["key"]])
    columns = pick_columns(rng, row, spec["key"], asked, rng.randint(2, 4))
    record = render([row], columns, kind, fmt, False, rng)
    return record, f"What is the {asked}?", row[asked]


def lookup_task(rng: random.Random, kind: str, fmt: str) -> tuple[str, str, str]:
    spec = KIND_SPECS[kind]
    n_rows = rng.randint(2, 5)
    rows = [spec["row"](rng, k) for k in spec["keys"](rng, n_rows)]
    asked = rng.choice([c for c in rows[0] if c != spec["key"]])
    columns = pick_columns(rng, rows[0], spec["key"], asked, extra_columns(n_rows, fmt))
    target = rng.choice(rows)
    record = render(rows, columns, kind, fmt, True, rng)
    question = f"What is the {asked} {spec['of']} {target[spec['key']]}?"
    return record, question, target[asked]


def count_task(rng: random.Random, kind: str, fmt: str) -> tuple[str, str, str]:
    """The count is drawn first (0..rows) so answers spread evenly over 0-5."""
    spec = KIND_SPECS[kind]
    n_rows = rng.randint(2, 5)
    rows = [spec["row"](rng, k) for k in spec["keys"](rng, n_rows)]
    field = rng.choice(tuple(spec["categorical"]))
    choices = spec["categorical"][field]
    value = rng.choice(choices)
    others = [c for c in choices if c != value]
    count = rng.randint(0, n_rows)
    hits = set(rng.sample(range(n_rows), count))
    for i, row in enumerate(rows):
        row[field] = value if i in hits else rng.choice(others)
    columns = pick_columns(rng, rows[0], spec["key"], field, extra_columns(n_rows, fmt))
    record = render(rows, columns, kind, fmt, True, rng)
    return record, f"How many {spec['unit']} have {field} {value}?", str(count)


TASK_BUILDERS = {"extract": extract_task, "lookup": lookup_task, "count": count_task}


# --- public API ------------------------------------------------------------------------------

def make_sample(seed: int, index: int) -> dict[str, str]:
    """Sample number `index` of the stream named by `seed`; depends on nothing else."""
    rng = random.Random(f"{seed}:{index}")
    kind, fmt, task = rng.choice(KINDS), rng.choice(FORMATS), rng.choice(TASKS)
    record, question, answer = TASK_BUILDERS[task](rng, kind, fmt)
    return {"id": f"{seed}-{index}", "kind": kind, "format": fmt, "task": task,
            "prompt": f"{record}\nQ: {question}\nA:", "answer": answer}


def iter_samples(n: int, seed: int) -> Iterator[dict[str, str]]:
    """Samples 0..n-1 of the stream named by `seed`, one at a time."""
    for index in range(n):
        yield make_sample(seed, index)


def generate_samples(n: int, seed: int) -> list[dict[str, str]]:
    """Samples 0..n-1 of the stream named by `seed`; same (n, seed) gives identical samples."""
    return list(iter_samples(n, seed))


def write_jsonl(samples, path: str | Path) -> Path:
    """Write one JSON object per line (UTF-8); returns the path written."""
    path = Path(path)
    with path.open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(s, ensure_ascii=False) + "\n" for s in samples)
    return path
