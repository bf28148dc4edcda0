"""The sweep parent run's name, from the multirun.yaml Hydra saves in the sweep folder."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from experiments.harness.identity import sweep_name, swept


def saved_sweep(folder: Path, task: list[str], params: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    hydra = {"overrides": {"task": task}, "sweeper": {"params": params or {}}}
    OmegaConf.save(OmegaConf.create({"hydra": hydra}), folder / "multirun.yaml")
    return folder


def cfg(name: str = "default") -> DictConfig:
    return OmegaConf.create({"experiment": {"name": name}})


def test_only_swept_overrides_are_named_as_typed(tmp_path: Path) -> None:
    folder = saved_sweep(
        tmp_path,
        ["strategy=single,multi-hop", "dataset=curated", "++k=range(5,15,5)", "x=[1,2]"],
        params={"retriever": "bm25,hybrid"},
    )
    assert swept(folder) == [
        "retriever=bm25,hybrid",
        "strategy=single,multi-hop",
        "k=range(5,15,5)",
    ]
    assert sweep_name(cfg(), folder, "curated") == (
        "sweep retriever=bm25,hybrid strategy=single,multi-hop k=range(5,15,5) · curated"
    )


def test_a_swept_dataset_is_not_named_twice_and_a_preset_leads(tmp_path: Path) -> None:
    folder = saved_sweep(tmp_path, ["dataset=curated,cross_book", "experiment=ablation"])
    assert sweep_name(cfg("ablation"), folder, "curated") == (
        "sweep ablation dataset=curated,cross_book"
    )


def test_nothing_swept_or_no_saved_config_names_the_experiment(tmp_path: Path) -> None:
    assert sweep_name(cfg(), tmp_path / "absent", "curated") == "sweep default · curated"
    folder = saved_sweep(tmp_path / "one", ["strategy=single"])
    assert sweep_name(cfg(), folder, "cross_book") == "sweep default · cross_book"
