"""The ablations: one module per ablation, each defining SPEC (see attnstudy.analysis.catalogue)."""
