"""The verdict at the end of a sweep (`python -m experiments.run -m ...`): a Hydra callback.

Hydra calls `on_multirun_end` in the process that launched the jobs, after the last one ended
(whichever launcher ran them); the runs are read back from MLflow by the sweep's id, so jobs that
ran in other processes or on other machines count the same. The verdict, with each run's worst
question of each set (why it failed, where its gold passages went, a link to its trace), is also
the description of the sweep's parent run: the MLflow UI shows it on that run's page.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

if TYPE_CHECKING:
    from experiments.results.runs import LoadedRun
    from experiments.scoring.failures import Corpus


class SweepVerdict(Callback):
    """Print the sweep's verdict (experiments.scoring.verdict) and where to look next."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Read the sweep's runs back and print at most ten lines about them."""
        # Imported here: Hydra builds its callbacks before any run, and a bad override must fail
        # before MLflow and pandas are imported.
        import mlflow

        from experiments.results.runs import connect, distinct_labels, latest_sweep, load_run
        from experiments.results.tracking import describe, sweep_complete, sweep_parents
        from experiments.scoring.failures import Corpus
        from experiments.scoring.verdict import Contender, verdict_lines

        if not config.tracking.enabled or config.experiment.dry_run:
            return
        experiment_id = connect(config.tracking.uri, str(config.tracking.experiment_name))
        run_ids = latest_sweep(experiment_id, str(config.hydra.sweep.dir))
        if len(run_ids) < 2:
            return
        runs = [load_run(r) for r in run_ids]
        distinct_labels(runs)
        print(
            "\nTables by set, type and gold hops: uv run python -m experiments.summary "
            + " ".join(run_ids)
            + "\nMLflow UI: make mlflow · dashboard: make dashboard\n"
        )
        lines = verdict_lines([Contender(r.label, r.questions, r.generator) for r in runs])
        print("\n".join(lines))
        parents = sweep_parents(experiment_id, str(config.hydra.sweep.dir))
        if parents:
            corpus = Corpus.of_folder(str(config.paths.corpus))
            describe(
                parents[0],
                sweep_note(lines, runs, experiment_id, mlflow.get_tracking_uri(), corpus),
            )
            sweep_complete(parents[0])
            print(
                "The verdict and each set's worst questions are the description of MLflow run "
                + parents[0]
            )


def sweep_note(
    lines: Sequence[str], runs: Sequence[LoadedRun], experiment_id: str, uri: str, corpus: Corpus
) -> str:
    """The parent run's description (Markdown): the verdict, then per set each run's worst failed
    question with its tags, where each gold passage went and a link to its trace."""
    from experiments.results.row import rows_of
    from experiments.results.traces import Target, case_key, trace_ids
    from experiments.results.tracking import trace_route
    from experiments.scoring.failures import gold_lines, worst_of

    heading, *rest = lines
    out = [f"**{heading}**", "", *(f"- {line.strip()}" for line in rest), ""]
    by_set: dict[str, list[str]] = {}
    for run in runs:
        rows = {row.question_id: row for row in rows_of(run.questions)}
        traced = trace_ids(Target(uri, experiment_id, run.run_id))
        worst = worst_of(rows.values(), n=len(rows), corpus=corpus).drop_duplicates("set")
        for question_id, tags in zip(worst["question_id"], worst["tags"], strict=True):
            row = rows[str(question_id)]
            found = traced.get(case_key(row.repeat, row.question_id))
            name = (
                f"[{row.question_id}]({trace_route(experiment_id, found)})"
                if found
                else f"`{row.question_id}`"
            )
            by_set.setdefault(row.set, []).append(
                f"- **{run.label}**: {name} ({', '.join(tags)}) — {row.question}\n"
                + "\n".join(f"  {line}" for line in gold_lines(row, corpus))
            )
    out.append("**Each run's worst question per set** (lowest recall@k, then token F1):")
    for name in sorted(by_set):
        out += ["", f"*{name}*", *by_set[name]]
    return "\n".join(out)
