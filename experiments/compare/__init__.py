"""The comparison of position encodings, `python -m experiments.compare` (experiments/compare/cli.py: the command and its --help).

    config.py    CompareConfig and its loading (TOML, preset, overrides); imports no other module of the package
    layout.py    where things are in the output folder: runs, cached evaluations, probe and task results, the record
                 of invocations
    running.py   the jobs: train, evaluate and probe one variant and seed each, in worker processes
    results.py   ComparisonResults: everything the report reads, gathered once from the output folder
    cells.py     how a table cell writes an estimate (every table of the report, the sections and experiments.ladder)
    findings.py  the statements made from the numbers, orders and papers' claims only where intervals allow
    plots.py     the figures
    probes.py    the probes run on each model, the task suite, and their report sections
    report.py    table.md, report.md (with the findings) and results.json
    cli.py       the command: settings -> jobs -> task suite -> report
"""
