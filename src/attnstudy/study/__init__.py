"""The study: its driver, the train and ablate tasks every executor runs, model and ablation runs,
trained adversaries, reference alignments, the runs' pages and checkpoints."""
