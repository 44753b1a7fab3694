"""``posenc tune``: measure every context-extension method on the user's own model within a budget, and write what
to deploy (docs/tune.md).

    plan.py     the candidates, each measurement's estimated cost, what the budget leaves out
    race.py     the race on paired windows (the elimination rule) and the answer (winner, runners-up, ties)
    measure.py  each measurement through posenc eval's loop (evaluate_model), kept for --resume
    report.py   the deploy file (config.json or patch_spec.json), results.json, report.md
    plots.py    perplexity.png (per candidate, its spread over the windows) and retrieval_heatmap.png
    ranks.py    --nproc / torchrun: the measurements spread over ranks, rank 0 deciding and writing
    command.py  the command
"""
