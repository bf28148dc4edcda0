"""Human labels on logged questions: why a person says a question failed (a failure tag or their
own words), kept as an MLflow feedback assessment by a human on the question's trace, tied to the
run, and read back per question."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from mlflow.entities import AssessmentSource, AssessmentSourceType
from mlflow.tracing.constant import AssessmentMetadataKey

from experiments.results.traces import CASE_TAG
from experiments.results.tracking import mlflow

LABEL = "human_label"
"""The assessment's name: its value is the reason, its rationale the person's note."""


@dataclass(frozen=True)
class Label:
    """One human label: the reason, an optional note, who gave it and when (ms since epoch)."""

    reason: str
    note: str = ""
    by: str = ""
    at_ms: int = 0

    def text(self) -> str:
        """'reason: note' (the reason alone without a note)."""
        return f"{self.reason}: {self.note}" if self.note else self.reason


def log_label(trace_id: str, run_id: str, reason: str, note: str = "", by: str = "") -> None:
    """Store a label on a question's trace as human feedback, with the run it belongs to."""
    if not reason.strip():
        raise ValueError("a label needs a reason (a failure tag or a few words)")
    mlflow.log_feedback(
        trace_id=trace_id,
        name=LABEL,
        value=reason.strip(),
        rationale=note.strip() or None,
        source=AssessmentSource(
            source_type=AssessmentSourceType.HUMAN, source_id=by.strip() or "dashboard"
        ),
        metadata={AssessmentMetadataKey.SOURCE_RUN_ID: run_id},
    )


def labels_of(experiment_id: str, run_id: str, cases: Mapping[str, str]) -> dict[str, Label]:
    """The latest human label of each question of a run, by question id (`cases`: case →
    question id, a case being the 'repeat:question id' its trace is tagged with; a question asked
    in repeats has a trace each); questions nobody labelled are left out."""
    found = mlflow.search_traces(
        locations=[experiment_id], run_id=run_id, include_spans=False, return_type="list"
    )
    labels: dict[str, Label] = {}
    for trace in found:
        question = cases.get(str(trace.info.tags.get(CASE_TAG, "")))
        if question is None:
            continue
        for assessment in trace.info.assessments or []:
            human = assessment.source is not None and (
                assessment.source.source_type == AssessmentSourceType.HUMAN
            )
            if assessment.name != LABEL or not human or assessment.valid is False:
                continue
            feedback = assessment.feedback
            label = Label(
                reason=str(feedback.value if feedback is not None else ""),
                note=assessment.rationale or "",
                by=assessment.source.source_id or "",
                at_ms=assessment.create_time_ms or 0,
            )
            if question not in labels or label.at_ms >= labels[question].at_ms:
                labels[question] = label
    return labels
