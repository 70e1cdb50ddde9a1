"""Experiments: what trains fleets of models and reports on them, composing train/ (one training) and eval/ (one
checkpoint measured).

    compare/   python -m experiments.compare: every encoding x seed trained and evaluated, one report
    ladder.py  python -m experiments.ladder: the comparison at several model sizes and budgets
    tasks.py   python -m experiments.tasks: synthetic tasks trained per encoding, scored at 1x-8x L
    jobs.py    what each of their worker jobs does around its work (logs, threads, reuse of finished runs)
    performance/  the measurements of docs/performance.md that are not user tools, and what every speed
                  measurement shares (measure.py)
"""
