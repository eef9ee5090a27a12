"""Upper bounds of the suite's size-like fields, each with why it lies where it does.

A size past its bound is refused while planning (one line naming the field and the accepted range)
instead of being tried: `n: 1000000000` printed nothing for two minutes while memory grew (issue 13).
Each bound is far above anything a benchmark on one machine measures, so only a typo or a unit
mistake reaches it. suite.py and the scenario specs (measure/scenarios/*.py) read them from here.
"""
from __future__ import annotations

# Samples are generated (about 30 µs each) or read, kept in memory and sent to every worker, and each
# round measures them: 100 000 take ~3 s to generate and hours to measure on a CPU.
MAX_SAMPLES = 100_000

# Tokens: 128k is the longest context of the open models a suite names; the model's own position table
# is checked on top of this (plan.check_positions).
MAX_TOKENS = 131_072

# Rows per forward call: past 1,024 a batch is a memory test, not a latency one (the server scenario's
# own bound).
MAX_BATCH = 1024

# Requests or passes sent per round: at a millisecond each, 100 000 is minutes per variant per round.
MAX_REQUESTS = 100_000
MAX_PASSES = 1000
MAX_WARMUP = 10_000

# Seconds: a phase or a minimum duration of a day; a measurement's timeout of a week.
MAX_DURATION_S = 86_400.0
MAX_TIMEOUT_S = 7 * 86_400.0

# Threads per worker: more than any machine's cores today.
MAX_THREADS = 4096

# Stop strings: each is searched in every decoded text.
MAX_STOP_STRINGS = 64

# Seeds reach torch.manual_seed, which takes a 64-bit integer (serve/sampling.py: SEED_RANGE).
SEED_MIN, SEED_MAX = -2**63, 2**63 - 1
