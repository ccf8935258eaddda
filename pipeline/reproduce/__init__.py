"""jobs/reproductions.py's body: the suites and the papers' numbers, the pretraining runs, the sweeps, the
downstream steps and the report (docs/reproductions.md)."""
