"""Sweeps: grid or random trials of a training script, run here or as a SLURM job array."""
