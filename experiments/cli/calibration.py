"""`python -m experiments.calibration`: fit adaptive's confidence calibration, judge it, report it.

    python -m experiments.calibration fit NAME dataset=hotpotqa   # -> caprag/calibrations/NAME.yaml
    python -m experiments.calibration check NAME dataset=curated  # ECE, mean confidence, AUC there
    python -m experiments.calibration summary curated=AUTO_RUN,DEPTH3_RUN ...  # report numbers

Overrides after NAME are the harness's Hydra overrides (dataset, retriever, strategy.depth_chunks).
A calibration must be judged on data it was not fitted on: `check` says so when the two match.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

import pandas as pd

from caprag.calibration import CALIBRATIONS
from caprag.config import PROJECT_ROOT
from experiments.scoring.calibration import (
    FEATURES,
    L2,
    UNBOUNDED,
    adaptive_summary,
    describe,
    fit,
    judge,
    load,
    save,
    signal_rows,
    verdict_line,
)


def collect(overrides: Sequence[str]) -> tuple[str, pd.DataFrame]:
    """`collect_one` for each dataset named (`dataset=a dataset=b` gathers both, e.g. to fit on
    every public benchmark), concatenated; the name joins theirs with '+'."""
    datasets = [o for o in overrides if o.startswith("dataset=")]
    rest = [o for o in overrides if not o.startswith("dataset=")]
    if len(datasets) <= 1:
        return collect_one(list(overrides))
    names, frames = [], []
    for chosen in datasets:
        name, frame = collect_one([chosen, *rest])
        names.append(name)
        frames.append(frame)
    return "+".join(names), pd.concat(frames, ignore_index=True)


def collect_one(overrides: Sequence[str]) -> tuple[str, pd.DataFrame]:
    """The dataset the Hydra overrides choose, each answerable question asked of adaptive with
    no confidence enough (so it goes through every depth) and no calibration: its name and one
    row per (question, round) with the signals and whether every gold passage was read."""
    from hydra import compose, initialize_config_dir

    from caprag.state import GraphState
    from experiments.harness.build import build_components

    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=["strategy=adaptive", "strategy.calibration=none", *overrides],
        )
    parts = build_components(cfg, llm=False)
    rows: list[dict[str, object]] = []

    async def ask_all() -> None:
        for case in parts.dataset.cases:
            scope = parts.index.restricted(case.scope) if case.scope is not None else None
            strategy = parts.make_strategy(
                retriever=scope or parts.index,
                steps=parts.steps,
                k=int(cfg.retriever.k),
                query_types=UNBOUNDED,
            )
            for turn in case.turns:
                if not turn.gold_passages:
                    continue
                question = turn.standalone or turn.question
                state = await strategy.execute(
                    GraphState(question=question, main_question=question)
                )
                for row in signal_rows(turn.id, turn.gold_passages, state.hops):
                    rows.append({"set": case.set, **row})

    asyncio.run(ask_all())
    return parts.dataset.name, pd.DataFrame(rows)


def summary_markdown(pairs: Sequence[tuple[str, str, str]]) -> str:
    """For each (label, auto run id, depth-3 run id): the target verdict, a table of tokens,
    recall, confidence and stops, and the paired significance of auto against depth 3."""
    from experiments.results.runs import load_run
    from experiments.results.tables import markdown_table
    from experiments.scoring.significance import compare_runs, render_table

    blocks: list[str] = []
    rows: list[list[str]] = []
    summaries = []
    for label, auto_id, deep_id in pairs:
        auto, deep = load_run(auto_id), load_run(deep_id)
        summary = adaptive_summary(auto.questions, deep.questions)
        summaries.append((label, summary, auto, deep))
    names = [
        ("questions", "questions", "{:.0f}"),
        ("tokens_deep", "prompt tokens/question, always depth 3", "{:,.0f}"),
        ("tokens_auto", "prompt tokens/question, adaptive auto", "{:,.0f}"),
        ("savings", "savings vs depth 3 (target >= 40 %)", "{:.1%}"),
        ("recall_at_k_deep", "recall@k (k = 8), depth 3", "{:.3f}"),
        ("recall_at_k_auto", "recall@k (k = 8), auto", "{:.3f}"),
        ("context_recall_deep", "cumulative recall (all passages read), depth 3", "{:.3f}"),
        ("context_recall_auto", "cumulative recall (all passages read), auto", "{:.3f}"),
        ("mean_confidence", "auto: mean final confidence", "{:.3f}"),
        ("success_rate", "auto: share with every gold passage read", "{:.3f}"),
        ("ece", "auto: ECE (5 buckets)", "{:.3f}"),
        ("auc", "auto: AUC of confidence for that success", "{:.3f}"),
        ("needed_2plus_rounds", "auto: needed 2+ rounds", "{:.1%}"),
        ("reached_threshold", "auto: reached its threshold", "{:.1%}"),
        ("depth_1", "auto: ended at depth 1", "{:.1%}"),
        ("depth_2", "auto: ended at depth 2", "{:.1%}"),
        ("depth_3", "auto: ended at depth 3", "{:.1%}"),
    ]
    stops = sorted({k for _, s, _, _ in summaries for k in s if k.startswith("stop:")})
    for key, text, form in names + [(k, f"auto: stopped by {k[5:]}", "{:.1%}") for k in stops]:
        rows.append([text, *(form.format(s[key]) if key in s else "—" for _, s, _, _ in summaries)])
    blocks.append(markdown_table(["", *(label for label, *_ in summaries)], rows))
    for label, summary, auto, deep in summaries:
        comparisons = compare_runs(
            deep.questions, auto.questions, ["recall_at_k", "context_recall", "prompt_tokens"]
        )
        blocks.append(
            f"**{label}** — {verdict_line(summary)}. Paired over {summary['questions']:.0f} "
            f"questions, A = depth 3 (`{deep.run_id}`), B = auto (`{auto.run_id}`); CI: "
            "percentile bootstrap, p: paired sign-flip permutation test (10,000 draws, "
            "experiments.scoring.significance):\n\n" + render_table(comparisons, markdown=True)
        )
    return "\n\n".join(blocks)


def main(argv: list[str] | None = None) -> int:
    """Fit adaptive's confidence calibration on one dataset, or judge a saved one on another."""
    parser = argparse.ArgumentParser(prog="python -m experiments.calibration", description=__doc__)
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="command", required=True)
    fit_cmd = sub.add_parser("fit", help="fit on the chosen dataset and save it")
    fit_cmd.add_argument("name")
    fit_cmd.add_argument("overrides", nargs="*")
    fit_cmd.add_argument("--features", nargs="+", default=list(FEATURES))
    fit_cmd.add_argument("--l2", type=float, default=L2)
    check_cmd = sub.add_parser("check", help="judge a saved calibration on the chosen dataset")
    check_cmd.add_argument("name")
    check_cmd.add_argument("overrides", nargs="*")
    summary_cmd = sub.add_parser(
        "summary", help="adaptive auto vs depth 3 from finished runs, as Markdown"
    )
    summary_cmd.add_argument(
        "pairs", nargs="+", metavar="LABEL=AUTO_RUN,DEPTH3_RUN", help="one per dataset"
    )
    args = parser.parse_args(argv)
    if args.command == "summary":
        from experiments.results.runs import connect

        connect()
        pairs = []
        for item in args.pairs:
            label, _, ids = item.partition("=")
            auto_id, _, deep_id = ids.partition(",")
            if not (label and auto_id and deep_id):
                parser.error(f"expected LABEL=AUTO_RUN,DEPTH3_RUN, got {item!r}")
            pairs.append((label, auto_id, deep_id))
        print(summary_markdown(pairs))
        return 0
    dataset, frame = collect(args.overrides)
    if frame.empty:
        print(f"{dataset}: no answerable question to fit or judge on", file=sys.stderr)
        return 1
    if args.command == "fit":
        calibration = fit(
            frame, args.features, args.l2, name=f"{dataset} {' '.join(args.overrides)}"
        )
        note = (
            f"Adaptive confidence calibration fitted on {dataset} ({len(frame)} question x depth "
            f"rows) by `python -m experiments.calibration fit {args.name} "
            f"{' '.join(args.overrides)}`. Judge it on another dataset "
            "(`python -m experiments.calibration check NAME dataset=...`)."
        )
        save(calibration, CALIBRATIONS / f"{args.name}.yaml", note)
        print(f"wrote {CALIBRATIONS / args.name}.yaml: {calibration}")
        print(describe(f"{dataset} (fitted on it: in-sample)", judge(calibration, frame)))
        return 0
    calibration = load(args.name)
    held_out = dataset not in calibration.fitted_on.split()[:1]
    label = f"{dataset} ({'held out' if held_out else 'IN-SAMPLE: fitted on this dataset'})"
    print(describe(label, judge(calibration, frame)))
    for (set_name, depth), group in frame.groupby(["set", "depth"]):
        print("  " + describe(f"{set_name} depth {depth}", judge(calibration, group)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
