"""explain: why one variant is slower than another, down to the operators, and where each stands on its roofline.

    categories.py   what each profiled operator is doing (a table of name patterns + the module it ran in)
    profiling.py    the worker side: plain and profiled runs of one workload, module regions marked
    counters.py     hardware counters (perf stat), or why there are none
    attribution.py  B − A per token, split into categories and operators (pure)
    roofline.py     a token's bytes and FLOPs, the floor from measured ceilings, the verdict (pure)
    run.py          `variantlab explain RUN A B` and `explain: true`: profile in fresh workers, explain
    render.py       the explanation in words and tables (terminal and Markdown)
"""
