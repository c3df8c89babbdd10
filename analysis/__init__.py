"""The studies run on trained models: interventions, the ablation battery, alignment, summary.

Every ablation is ``run_<name>(model, batch: PreparedBatch, cfg: AblationConfig) -> DataFrame``
(one row per real decoder step); :func:`analysis.suite.run_suite` runs the configured battery.
Submodules are imported on use, so ``import analysis`` stays light.
"""

__all__ = [
    "alignment",
    "common",
    "divergences",
    "erasure",
    "interventions",
    "permutation",
    "seed_variance",
    "suite",
]
