"""The studies run on trained models: the ablation catalogue and its ablations, interventions,
divergences, the suite, figures, seed variance. Installed as ``attnstudy.analysis`` (the folder
``analysis/`` at the top of the repository is mapped onto it).

Submodules are imported on use, so ``import attnstudy.analysis`` stays light.
"""

if (
    __name__ != "attnstudy.analysis"
):  # the repository root on sys.path would make it a second package
    raise ImportError(
        f"the analysis package must be imported as attnstudy.analysis, not as {__name__!r} "
        "(two copies would hold two ablation catalogues that disagree)"
    )
