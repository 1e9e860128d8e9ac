"""The study layer: study files (``files``), sweeps (``sweep``: plan and execute, a grid of
keys by ``grid``) and their figures (``plot``)."""
