"""Scoring a model's outputs: error rates, translation metrics (BLEU, chrF) and bootstrap
intervals."""
