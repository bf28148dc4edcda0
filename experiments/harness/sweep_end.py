"""The verdict at the end of a sweep (`python -m experiments.run -m ...`): a Hydra callback.

Hydra calls `on_multirun_end` in the process that launched the jobs, after the last one ended
(whichever launcher ran them); the runs are read back from MLflow by the sweep's id, so jobs that
ran in other processes or on other machines count the same.
"""

from __future__ import annotations

from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class SweepVerdict(Callback):
    """Print the sweep's verdict (experiments.scoring.verdict) and where to look next."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        """Read the sweep's runs back and print at most ten lines about them."""
        # Imported here: Hydra builds its callbacks before any run, and a bad override must fail
        # before MLflow and pandas are imported.
        from experiments.results.runs import connect, distinct_labels, latest_sweep, load_run
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
        print(
            "\n".join(verdict_lines([Contender(r.label, r.questions, r.generator) for r in runs]))
        )
