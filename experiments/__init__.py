"""The caprag harness: Hydra experiments, metrics, MLflow tracking, reports, dashboard."""

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from caprag import disable_telemetry
from caprag.config import PROJECT_ROOT
from caprag.options import BUILT_IN
from caprag.registry import ROLES, load_plugins

disable_telemetry()
OmegaConf.register_new_resolver(
    "project", lambda sub="": str(PROJECT_ROOT / sub) if sub else str(PROJECT_ROOT), replace=True
)
ConfigStore.instance().store(name="step_roles", node={role: "auto" for role in ROLES})
"""conf/config.yaml's top-level `<role>: auto` keys (expander=, analyzer=, ...), one per role."""
for _name, _options in BUILT_IN.items():  # conf/strategy/NAME.yaml's defaults: the model's
    ConfigStore.instance().store(group="strategy_options", name=_name, node=_options.node())
load_plugins()  # CAPRAG_PLUGINS: registered before any config is composed or page drawn
