"""Experiments of many stages: a paper's table reproduced cell by cell (reproduce.py) and the tuned comparison
(tuned_comparison.py), built over the sweep's stages."""
