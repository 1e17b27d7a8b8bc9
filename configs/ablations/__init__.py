"""Ablation sweeps, one config per benchmark (see :mod:`configs.ablations.sweeps`)."""
