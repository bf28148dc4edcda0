"""The step roles: the name a user picks rule or LLM by for each LLM step.

One list, read everywhere a role is named: `caprag.steps` (which implementation runs each step),
the settings (a CAPRAG_<ROLE> variable per role), the harness (a top-level `<role>=` key per role)
and the dashboard's Ask page. It lives in a module of its own, free of the steps' imports, so the
settings can derive their fields from it without loading any model client.
"""

from __future__ import annotations

ROLES: dict[str, str] = {
    "expander": "expand",
    "analyzer": "analyze",
    "generator": "generate",
    "rewriter": "rewrite",
    "classifier": "classify",
    "confidence": "assess",
    "reasoner": "reason",
    "asker": "ask",
}
"""The name a user chooses an implementation by (Hydra key, CAPRAG_<NAME> variable) → its step."""
